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
the gate's outcome hook) never acts: a replayed old fault does not take a repaired node out
again. What it does with every event is logged and counted
(``gpuops_health_events_total{kind,outcome}``).

The XID counts of the threshold windows live in memory: an engine restarted within a window
counts that window's XIDs again from its start (Prometheus' rules in ``rules/health`` count
from the exporter's series, which survive it).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from gpuops.model.decisions import Decision, Outcome
from gpuops.model.health.catalogue import XidCatalogue
from gpuops.model.health.events import EventKind, Fault, HealthEvent, fault_alert
from gpuops.model.health.faults import XidEvent, xid_faults
from gpuops.runtime.alerts import AlertInbox

log = logging.getLogger(__name__)

REMEMBERED_IDS = 100_000
"""Event ids remembered for deduplication (an agent resends what it has not seen answered:
seconds to minutes of events, far fewer than this)."""


@dataclass(frozen=True)
class HealthReceipt:
    """What one request's events came to."""

    accepted: int
    duplicates: int
    faults: int
    skipped: int


class HealthInbox:
    """Counts the pushed events and raises the faulty GPUs' alerts."""

    def __init__(
        self,
        *,
        catalogue: XidCatalogue,
        alerts: AlertInbox,
        clock: Callable[[], float],
        registry: CollectorRegistry,
    ) -> None:
        self.catalogue = catalogue
        self._alerts = alerts
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._xids: dict[tuple[str, str], deque[XidEvent]] = {}
        self._returned: dict[str, float] = {}
        windows = [e.threshold.window_s for e in catalogue if e.threshold is not None]
        self._window = max(windows, default=3600.0)
        self.events = Counter(
            "gpuops_health_events",
            "Health events pushed by node agents, by kind (xid, gpu_lost) and what became of "
            "them (fault, counted, duplicate, before_return, unknown_xid).",
            ["kind", "outcome"],
            registry=registry,
        )

    def set_catalogue(self, catalogue: XidCatalogue) -> None:
        with self._lock:
            self.catalogue = catalogue

    def returned(self, node: str, at: float) -> None:
        """``node`` went back into service at ``at``: older events never act on it."""
        with self._lock:
            self._returned[node] = max(at, self._returned.get(node, 0.0))

    def outcome(self, decision: Decision, outcome: Outcome) -> None:
        """The gate's outcome hook: a ``resume`` that succeeded returns its node."""
        node = decision.target.labels.get("node")
        if outcome.ok and decision.action is not None and decision.action.type == "resume":
            if node:
                self.returned(node, self._clock())

    def submit(self, events: Sequence[HealthEvent]) -> HealthReceipt:
        """Take one request's events; raise what the alert inbox raises (nothing is kept)."""
        with self._lock:
            seen: set[str] = set()  # ids of this request
            xids: dict[tuple[str, str], deque[XidEvent]] = {}  # the windows it touches, copied
            faults: list[Fault] = []
            outcomes: list[tuple[HealthEvent, str]] = []
            for event in events:
                outcome = self._take(event, seen, xids, faults)
                outcomes.append((event, outcome))
            if faults:
                self._alerts.submit([fault_alert(f) for f in faults])
            for event, outcome in outcomes:  # stored: now they count as handled
                self.events.labels(event.kind.value, outcome).inc()
                if outcome != "duplicate":
                    self._seen[event.id] = None
            while len(self._seen) > REMEMBERED_IDS:
                self._seen.popitem(last=False)
            self._xids.update(xids)
        for fault in faults:
            log.warning(
                "GPU %s on %s is faulty: %s; raised %s (remedy %s)",
                fault.gpu,
                fault.node,
                fault.reason,
                "GpuFault",
                fault.remedy.value,
            )
        counts = [o for _, o in outcomes]
        return HealthReceipt(
            accepted=len(events) - counts.count("duplicate"),
            duplicates=counts.count("duplicate"),
            faults=len(faults),
            skipped=counts.count("before_return") + counts.count("unknown_xid"),
        )

    def _take(
        self,
        event: HealthEvent,
        seen: set[str],
        xids: dict[tuple[str, str], deque[XidEvent]],
        faults: list[Fault],
    ) -> str:
        if event.id in seen or event.id in self._seen:
            return "duplicate"
        seen.add(event.id)
        if event.at <= self._returned.get(event.node, float("-inf")):
            log.info(
                "health event %s of GPU %s on %s is older than the node's return to service: "
                "it does not act",
                event.id,
                event.gpu,
                event.node,
            )
            return "before_return"
        if event.kind is EventKind.GPU_LOST:
            faults.append(Fault.of_lost(event))
            return "fault"
        assert event.xid is not None
        entry = self.catalogue.entry(event.xid)
        if entry is None:
            log.info(
                "XID %d of GPU %s on %s is not in the XID catalogue: recorded only",
                event.xid,
                event.gpu,
                event.node,
            )
            return "unknown_xid"
        key = (event.node, event.gpu)
        window = xids.get(key)
        if window is None:
            window = xids[key] = deque(self._xids.get(key, ()))
        window.append(XidEvent(event.node, event.gpu, event.xid, event.at))
        if len(window) > 1 and event.at < window[-2].at:  # late: keep the window in order
            window = xids[key] = deque(sorted(window, key=lambda e: e.at))
        latest = window[-1].at
        while window and window[0].at < latest - self._window:
            window.popleft()
        # at the GPU's latest event: one that arrives late still counts in its window
        found = [f for f in xid_faults(self.catalogue, window, latest) if f.entry.code == event.xid]
        faults.extend(Fault.of_xid(f) for f in found)
        return "fault" if found else "counted"
