"""``HealthInbox``: the node agents' health events to ``GpuFault`` alerts in the alert inbox.

The push route (``gpuops.api.routes.health``) hands it the events of one request. Each event
is checked once (its id; a second sending is a duplicate), an XID is counted against the XID
catalogue per GPU (``gpuops.model.health.faults``), a lost GPU is a fault at once. For every
GPU found faulty it submits the alert ``GpuFault`` (``gpuops.model.health.events.fault_alert``)
to the alert inbox (``gpuops.runtime.alerts``): durably queued there, deduplicated by episode,
decided by the policies its labels trigger (``rules/health/health.yaml``) and run through the
gate like any alert. The request is answered once the alerts are stored; when they cannot be
(``InboxFull``, ``StateError``) nothing of the request is remembered, so the agent's retry is
handled in full.

An event older than its node's last return to service (a ``resume`` that succeeded, told by
the gate's outcome hook and kept in the store) or older than ``health.max_event_age`` never
acts: a replayed old fault does not take a repaired node out again. The agent tags each
event with the boot it was seen in and sends its node's boot now with each request: an
application's XID of another boot is kept by its id only (its process is gone), while a lost
GPU or an XID of the hardware or the driver from before the reboot still acts (the reboot may
be the fault's own doing, and a GPU gone after it is never reported again; one the reboot
healed passes the ladder's health check). What it does with every event is logged and
counted (``gpuops_health_events_total{kind,outcome}``).

The labels an agent sends with its node are kept only where ``health.ladder.pacing.domains``
names them (its failure domains), at most ``max_domain_values`` values of each; the others
are left out of the alert, said in the log and the call's audit, and counted
(``gpuops_health_labels_ignored_total{reason}``).

Every event is kept in the state store by its id (``health_events``): a duplicate is known
across restarts and replicas, and a GPU's XIDs within the longest threshold window are read
back from there; so are the nodes' returns to service (``kind = returned``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuops.model.decisions import Decision, Outcome, Transition
from gpuops.model.health.catalogue import XidCatalogue, XidClass
from gpuops.model.health.events import FAULT_ALERT, EventKind, Fault, HealthEvent, fault_alert
from gpuops.model.health.faults import XidEvent, xid_faults
from gpuops.model.health.pacing import DEFAULT, POLICY
from gpuops.runtime.alerts import AlertInbox
from gpuops.store.interface import HealthRepository

log = logging.getLogger(__name__)

FAULT_TRIGGER = f"alertmanager: {FAULT_ALERT}"
"""The evidence of a decision the ``GpuFault`` alert triggered
(``gpuops.model.evaluation.alertmanager``)."""


_SKIPPED = {
    "before_reboot": "from before the node's reboot",
    "before_return": "older than the node's return to service",
    "stale": "older than health.max_event_age",
    "unknown_xid": "XID {xid} is not in the XID catalogue",
}
"""Why an event does not act, by its outcome."""

MAX_DOMAIN_VALUES = 256
"""Values of one failure domain's label the engine keeps: a further one is left out (its node
is paced in ``<label>=default``)."""


@dataclass(frozen=True)
class HealthReceipt:
    """What one request's events came to."""

    accepted: int
    duplicates: int
    faults: int
    skipped: int
    notes: tuple[str, ...] = ()
    """What was raised and what was skipped, and why, one line each (audited with the call)."""


class HealthInbox:
    """Counts the pushed events and raises the faulty GPUs' alerts."""

    def __init__(
        self,
        *,
        catalogue: XidCatalogue,
        store: HealthRepository,
        alerts: AlertInbox,
        clock: Callable[[], float],
        registry: CollectorRegistry,
        max_event_age: float = 3600.0,
        profiles: Mapping[str, str] | None = None,
        default_profile: str = "quarantine",
        domains: Sequence[str] = (),
        known_domains: Iterable[str] = (),
        max_domain_values: int = MAX_DOMAIN_VALUES,
    ) -> None:
        """``domains``: the labels an agent sends that are kept (``pacing.domains``, but
        ``pool`` and ``policy``: the engine's own);
        ``known_domains``: the domains kept before (``rack=r12``, from the store), counted
        against ``max_domain_values``."""
        self.catalogue = catalogue
        self.domains = frozenset(domains) - {"pool", POLICY}
        self.max_domain_values = max_domain_values
        self._values: dict[str, set[str]] = {}
        """The values kept of each domain label."""
        for known in known_domains:
            name, _, value = known.partition("=")
            if name in self.domains:
                self._values.setdefault(name, set()).add(value)
        self.max_event_age = max_event_age
        self.profiles = dict(profiles or {})
        self.default_profile = default_profile
        self._store = store
        self._alerts = alerts
        self._clock = clock
        self._lock = threading.Lock()
        self.events = Counter(
            "gpuops_health_events",
            "Health events pushed by node agents, by kind (xid, gpu_lost) and what became of "
            "them (fault, counted, duplicate, before_reboot, before_return, stale, unknown_xid).",
            ["kind", "outcome"],
            registry=registry,
        )
        self.labels_ignored = Counter(
            "gpuops_health_labels_ignored",
            "Labels of a node its agent sent that the engine left out of the fault: not a "
            "failure domain (not_a_domain), or a value past the bound on a domain's values "
            "(over_bound).",
            ["reason"],
            registry=registry,
        )
        self.quarantine_seconds = Histogram(
            "gpuops_health_time_to_quarantine_seconds",
            "From a pushed fault (the event NVML reported) to its node's quarantine done: each "
            "successful action of a policy the GpuFault alert triggers.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900),
            registry=registry,
        )

    def profile(self, pool: str) -> str:
        """What a faulty GPU of ``pool`` does: ``quarantine`` or ``observe``."""
        return self.profiles.get(pool, self.default_profile)

    @property
    def window_s(self) -> float:
        """The longest threshold window of the catalogue: how far back XIDs are counted."""
        windows = [e.threshold.window_s for e in self.catalogue if e.threshold is not None]
        return max(windows, default=3600.0)

    def returned(self, node: str, at: float) -> None:
        """``node`` went back into service at ``at``: older events never act on it (kept in
        the store: also after a restart, and on another replica)."""
        with self._lock:
            record = HealthEvent(f"returned:{node}:{at!r}", node, "", EventKind.RETURNED, at)
            self._store.health_events_add([record], self._clock())

    def outcome(self, decision: Decision, outcome: Outcome) -> None:
        """The gate's outcome hook: a ``resume`` that succeeded returns its node; the first
        action a ``GpuFault`` alert triggered is timed from the fault."""
        if not outcome.ok or decision.action is None:
            return
        node = decision.target.labels.get("node")
        if decision.action.type == "resume" and node:
            self.returned(node, self._clock())
        elif decision.evidence.expr == FAULT_TRIGGER and decision.transition is Transition.FIRE:
            if decision.repeat == 0:
                elapsed = self._clock() - decision.episode_start
                self.quarantine_seconds.observe(max(0.0, elapsed))

    def submit(self, events: Sequence[HealthEvent], boot_id: str = "") -> HealthReceipt:
        """Take one request's events (``boot_id``: the sending agent's boot now, empty: not
        sent); raise what the alert inbox or the store raises (then nothing of the request is
        kept: the agent sends it again)."""
        with self._lock:
            known = self._store.health_events_known([e.id for e in events])
            fresh: dict[str, HealthEvent] = {}
            outcomes: list[tuple[HealthEvent, str]] = []
            for event in events:
                if event.id in known or event.id in fresh:
                    outcomes.append((event, "duplicate"))
                else:
                    fresh[event.id] = event
            faults: list[Fault] = []
            windows: dict[tuple[str, str], list[XidEvent]] = {}
            returns: dict[str, float | None] = {}  # each node's last return, read once
            ignored: list[str] = []  # each label left out, by name
            for event in fresh.values():
                if boot_id and event.boot_id and event.boot_id != boot_id:
                    if not self._outlives_reboot(event):
                        log.info(
                            "health event %s of GPU %s on %s is from before the node's reboot "
                            "(boot %s, now %s): its process is gone, it does not act",
                            event.id,
                            event.gpu,
                            event.node,
                            event.boot_id,
                            boot_id,
                        )
                        outcomes.append((event, "before_reboot"))
                        fresh[event.id] = replace(event, kind=EventKind.EARLIER_BOOT)
                        continue
                    log.warning(
                        "health event %s of GPU %s on %s is from before the node's reboot "
                        "(boot %s, now %s): a fault of the GPU, it acts (one the reboot healed "
                        "passes the health check)",
                        event.id,
                        event.gpu,
                        event.node,
                        event.boot_id,
                        boot_id,
                    )
                if event.node not in returns:
                    returns[event.node] = self._store.health_returned(event.node)
                returned = returns[event.node]
                if returned is not None and event.at <= returned:
                    log.info(
                        "health event %s of GPU %s on %s is older than the node's return to "
                        "service: it does not act",
                        event.id,
                        event.gpu,
                        event.node,
                    )
                    outcomes.append((event, "before_return"))
                    continue
                outcomes.append((event, self._take(self._domains(event, ignored), windows, faults)))
            faults, values, over = self._bounded(faults)
            if faults:
                self._alerts.submit([fault_alert(f, self.profile(f.pool)) for f in faults])
            self._store.health_events_add(list(fresh.values()), self._clock())
            for name, kept in values.items():
                self._values.setdefault(name, set()).update(kept)
        for event, outcome in outcomes:
            self.events.labels(event.kind.value, outcome).inc()
        for fault in faults:
            log.warning(
                "GPU %s on %s is faulty: %s; raised %s (remedy %s, profile %s)",
                fault.gpu,
                fault.node,
                fault.reason,
                FAULT_ALERT,
                fault.remedy.value,
                self.profile(fault.pool),
            )
        counts = [o for _, o in outcomes]
        notes = [
            f"{f.gpu} on {f.node}: {f.reason}: {FAULT_ALERT} raised ({self.profile(f.pool)})"
            for f in faults
        ]
        if ignored:
            self.labels_ignored.labels("not_a_domain").inc(len(ignored))
            names = ", ".join(sorted(set(ignored)))
            notes.append(f"labels left out (not in health.ladder.pacing.domains): {names}")
            log.info(
                "health events: labels left out (not in health.ladder.pacing.domains): %s", names
            )
        for node, name, value in over:
            why = (
                f"label {name}={value!r} of {node} left out: {self.max_domain_values} values of "
                f"{name} are kept already (the node is paced in {name}={DEFAULT})"
            )
            notes.append(why)
            log.warning("health events: %s", why)
            self.labels_ignored.labels("over_bound").inc()
        notes += [
            f"skipped {e.id} ({e.gpu} on {e.node}): {_SKIPPED[o].format(xid=e.xid)}"
            for e, o in outcomes
            if o in _SKIPPED
        ]
        return HealthReceipt(
            accepted=len(fresh),
            duplicates=counts.count("duplicate"),
            faults=len(faults),
            skipped=sum(counts.count(o) for o in _SKIPPED),
            notes=tuple(notes),
        )

    def _domains(self, event: HealthEvent, ignored: list[str]) -> HealthEvent:
        """``event`` with only the labels that name its node's failure domains; the names of
        the others added to ``ignored``."""
        kept = tuple((k, v) for k, v in event.labels if k in self.domains and v)
        ignored.extend(k for k, _ in event.labels if k not in self.domains)
        return event if kept == event.labels else replace(event, labels=kept)

    def _bounded(
        self, faults: list[Fault]
    ) -> tuple[list[Fault], dict[str, set[str]], list[tuple[str, str, str]]]:
        """``faults`` with each domain label whose value would be past ``max_domain_values``
        left out; the values they add (kept once the request is); what was left out (node,
        label, value)."""
        added: dict[str, set[str]] = {}
        over: list[tuple[str, str, str]] = []
        bounded = []
        for fault in faults:
            labels = []
            for name, value in fault.labels:
                kept = self._values.get(name, set())
                new = added.setdefault(name, set())
                if value in kept or value in new:
                    labels.append((name, value))
                elif len(kept) + len(new) < self.max_domain_values:
                    new.add(value)
                    labels.append((name, value))
                else:
                    over.append((fault.node, name, value))
            bounded.append(
                fault if len(labels) == len(fault.labels) else replace(fault, labels=tuple(labels))
            )
        return bounded, added, over

    def _outlives_reboot(self, event: HealthEvent) -> bool:
        """Whether ``event``, from before its node's reboot, may still say something of the
        GPU: a lost GPU, or an XID of the hardware or the driver (the reboot that followed may
        be the fault's own doing, and a GPU gone after it is never reported again). An
        application's XID, or one the catalogue does not know, said what its process did."""
        if event.kind is EventKind.GPU_LOST:
            return True
        entry = None if event.xid is None else self.catalogue.entry(event.xid)
        return entry is not None and entry.xid_class is not XidClass.APPLICATION

    def _take(
        self,
        event: HealthEvent,
        windows: dict[tuple[str, str], list[XidEvent]],
        faults: list[Fault],
    ) -> str:
        age = self._clock() - event.at
        if age > self.max_event_age and event.kind is EventKind.GPU_LOST:
            log.info("health event %s is %.0f s old: it does not act", event.id, age)
            return "stale"
        if event.kind is EventKind.GPU_LOST:
            faults.append(Fault.of_lost(event))
            return "fault"
        assert event.xid is not None
        if self.catalogue.entry(event.xid) is None:
            log.info(
                "XID %d of GPU %s on %s is not in the XID catalogue: recorded only",
                event.xid,
                event.gpu,
                event.node,
            )
            return "unknown_xid"
        key = (event.node, event.gpu)
        window = windows.get(key)
        if window is None:  # this GPU's XIDs kept before, within the longest window
            kept = self._store.health_xids(event.node, event.gpu, event.at - self.window_s)
            window = windows[key] = [XidEvent(e.node, e.gpu, e.xid or 0, e.at) for e in kept]
        window.append(XidEvent(event.node, event.gpu, event.xid, event.at))
        latest = max(e.at for e in window)  # a late event still counts in its window
        found = [f for f in xid_faults(self.catalogue, window, latest) if f.entry.code == event.xid]
        if found and age > self.max_event_age:  # counted in its window, acting on nothing
            log.info("XID event %s is %.0f s old: counted, it does not act", event.id, age)
            return "stale"
        faults.extend(Fault.of_xid(f, event.pool, event.labels) for f in found)
        return "fault" if found else "counted"
