"""Faults injected into a running simulated fleet, and what they cost: the reliability
what-if (``gpuops whatif --faults SCALE``, docs/whatif.md "Reliability: GPU faults").

``FaultPlan`` is what the run asks for: hardware faults at a published rate times a scale
(``gpuops.sim.faults``), floods of an application XID from crashed jobs, and how fast a person
on call acts. ``Injector`` is stepped by the fleet after each of its steps
(``gpuops.sim.fleet.virtual.VirtualFleet``) and does to the cluster what the faults do:

- at its time, a fault opens on its GPU (``FaultState``, which also answers the fleet's
  ``reset_gpu``, ``reboot`` and ``validate``: ``Cluster.health``), the jobs on the GPU crash,
  losing their work since their last checkpoint, and the event the node agent would push is
  put in ``outbox``;
- while a faulty GPU's node stays in service, every job the scheduler places on that GPU
  crashes too (a "black hole": the scheduler does not know);
- a flood is one crashed job's application XID (45) on one GPU of each node that runs jobs:
  events only, no GPU is faulty;
- a person on call notices a faulty node still in service ``response_s`` after its fault,
  drains it and repairs it (``fix_s``; a part to replace ``replace_s``), then resumes it:
  without gpuops (``manual``) every faulty node, with gpuops those the engine left in service;
  with gpuops the person also takes the nodes the remediation ladder hands over
  (``hand_over``), as fast, and clears them (``cleared``) for the engine.

It measures what ``ReliabilityFigures`` holds, each GPU-second in one bucket: work lost to
crashes, work lost to the drains of faulty or quarantined nodes, GPUs out of service for a
fault or a quarantine, faulty GPUs left in service and free; the useful share of the fleet's
GPU time; quarantines (true and false: told by the what-if's decision listener through
``quarantined``); remediation attempts; repairs by a person; each incident's time to
quarantine and to healthy service. Nothing here decides anything: the engine does, in the
policies-on run.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from gpuops.model.health.catalogue import XidCatalogue
from gpuops.model.health.faults import XidEvent
from gpuops.sim.faults import (
    DAY_S,
    HOUR_S,
    FaultRates,
    FaultState,
    Fix,
    InjectedFault,
    app_flood,
    draw_faults,
    strike,
)
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.report import p95

log = logging.getLogger(__name__)

FLOOD_CODE = 45
"""The application XID of a flood: a process ended (its job crashed or was killed)."""


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a reliability what-if, and the person on call."""

    rates: FaultRates
    floods_per_day: float = 2.0
    """Crashed jobs whose application XID reaches every node running jobs, per virtual day."""
    response_s: float = 4 * HOUR_S
    """From a fault on a node still in service, or a hand-over by the remediation ladder, to
    a person acting on the node."""
    fix_s: float = 1 * HOUR_S
    """A person's repair of a node whose fault a reset or a reboot heals (or none was
    found), diagnosis included."""
    replace_s: float = DAY_S
    """A person's repair of a node with a part to replace."""

    def __post_init__(self) -> None:
        for name in ("floods_per_day", "response_s", "fix_s", "replace_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"faults: {name} must be a number >= 0, got {value}")


LADDER_WINDOW_S = 7 * DAY_S
"""The remediation ladder's default window: a node's second remediation within it goes to a
person (``health.ladder.window``)."""


def ladder_window_s(plan: FaultPlan) -> float:
    """The ladder's window scaled with the faults' rate: at ``scale`` times the published rate
    a node's second fault within ``window / scale`` is as likely as one within ``window`` at
    the published rate."""
    return LADDER_WINDOW_S / max(plan.rates.scale, 1.0)


@dataclass
class Incident:
    """One injected fault and what became of it."""

    fault: InjectedFault
    in_service: bool | None = None
    """Whether its node was in service when it struck (None: not yet struck)."""
    out_at: float | None = None
    """When its node left service after it (drained, being repaired)."""
    healthy_at: float | None = None
    """When its node was back in service with the fault healed."""


@dataclass(frozen=True)
class ReliabilityFigures:
    """What the faults cost one run (``Injector.figures``)."""

    faults: int
    floods: int
    """Floods of an application XID (each one event per node that ran jobs)."""
    flood_events: int
    job_crashes: int
    """Jobs crashed: at a fault, and each start on a faulty GPU left in service."""
    crash_gpu_hours: float
    """Work lost to crashes (since the last checkpoint) and their relaunches, GPU-hours."""
    drain_gpu_hours: float
    """Work lost by the jobs a drain of a faulty or quarantined node stopped, and their
    relaunches."""
    out_gpu_hours: float
    """GPU-hours of nodes out of service (drained, being repaired) for a fault or a
    quarantine."""
    faulty_gpu_hours: float
    """GPU-hours of faulty GPUs left in service while no job held them."""
    capacity_gpu_hours: float
    """The fleet's GPUs times the run's time."""
    held_gpu_hours: float
    """GPU-hours jobs held."""
    quarantines_true: int
    quarantines_false: int
    """Nodes the engine drained with no open fault (a flood, a fault healed meanwhile)."""
    resets: int
    reboots: int
    hand_overs: int
    """Nodes the remediation ladder handed to a person."""
    person_repairs: int
    """Nodes a person drained or took over, and repaired."""
    to_quarantine_s: tuple[float, ...]
    """Per incident on a node in service: from the fault to its node out of service."""
    to_healthy_s: tuple[float, ...]
    """Per incident healed: from the fault to its node back in service, healed."""
    unhealed: int
    """Incidents whose node was not back in service healed at the end (left out of
    ``to_healthy_s``)."""

    @property
    def lost_gpu_hours(self) -> float:
        return (
            self.crash_gpu_hours
            + self.drain_gpu_hours
            + self.out_gpu_hours
            + (self.faulty_gpu_hours)
        )

    @property
    def useful_share(self) -> float | None:
        """The fleet's GPU time jobs held, less what crashes and drains lost."""
        if self.capacity_gpu_hours <= 0:
            return None
        lost = self.crash_gpu_hours + self.drain_gpu_hours
        return max(0.0, self.held_gpu_hours - lost) / self.capacity_gpu_hours

    def as_dict(self) -> dict[str, object]:
        return {
            "faults": self.faults,
            "floods": self.floods,
            "flood_events": self.flood_events,
            "job_crashes": self.job_crashes,
            "lost_gpu_hours": round(self.lost_gpu_hours, 2),
            "crash_gpu_hours": round(self.crash_gpu_hours, 2),
            "drain_gpu_hours": round(self.drain_gpu_hours, 2),
            "out_gpu_hours": round(self.out_gpu_hours, 2),
            "faulty_gpu_hours": round(self.faulty_gpu_hours, 2),
            "capacity_gpu_hours": round(self.capacity_gpu_hours, 2),
            "held_gpu_hours": round(self.held_gpu_hours, 2),
            "useful_share": _round(self.useful_share, 4),
            "quarantines_true": self.quarantines_true,
            "quarantines_false": self.quarantines_false,
            "resets": self.resets,
            "reboots": self.reboots,
            "hand_overs": self.hand_overs,
            "person_repairs": self.person_repairs,
            "to_quarantine_median_s": _round(median(self.to_quarantine_s), 1),
            "to_quarantine_p95_s": _round(p95(self.to_quarantine_s), 1),
            "to_healthy_median_s": _round(median(self.to_healthy_s), 1),
            "to_healthy_p95_s": _round(p95(self.to_healthy_s), 1),
            "unhealed": self.unhealed,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def median(values: tuple[float, ...]) -> float | None:
    """The median, None without values."""
    return statistics.median(values) if values else None


def _restart_gpu_s(changed: Mapping[str, object]) -> float:
    """What the restarts of the jobs a drain stopped cost (a fleet ``migrate``'s answer)."""
    restart = changed.get("restart_gpu_s", 0.0)
    return float(restart) if isinstance(restart, int | float) else 0.0


def draw(
    plan: FaultPlan,
    gpus: list[tuple[str, str]],
    horizon_s: float,
    catalogue: XidCatalogue,
    rng: random.Random,
) -> tuple[list[InjectedFault], list[float]]:
    """The faults on ``gpus`` ((node, GPU UUID) pairs) and the floods' times within
    ``horizon_s`` virtual seconds."""
    faults = draw_faults(plan.rates, gpus, 0.0, horizon_s, catalogue, rng)
    floods: list[float] = []
    rate_s = plan.floods_per_day / DAY_S
    at = 0.0
    while rate_s > 0:
        at += rng.expovariate(rate_s)
        if at >= horizon_s:
            break
        floods.append(at)
    return faults, floods


class Injector:
    """Faults and floods into one run's cluster, a person on call, and what it all cost."""

    def __init__(
        self,
        plan: FaultPlan,
        cluster: Cluster,
        horizon_s: float,
        catalogue: XidCatalogue,
        seed: int,
        manual: bool,
        drawn: tuple[list[InjectedFault], list[float]] | None = None,
    ) -> None:
        """``manual``: no gpuops (the person acts on every fault); else the engine quarantines
        and the person acts on what it left in service or the ladder hands over. The faults
        and floods come from ``seed`` alone, so both runs of a what-if get the same ones
        (``drawn``: these faults and flood times instead)."""
        self.plan = plan
        self.manual = manual
        with cluster.lock:
            gpus = [(n.name, g.uuid) for n in cluster.nodes.values() for g in n.gpus]
            self.pools = {n.name: n.pool for n in cluster.nodes.values()}
        if drawn is None:
            drawn = draw(plan, gpus, horizon_s, catalogue, random.Random(f"faults:{seed}"))
        self.faults, self.floods = drawn
        self.state = FaultState()
        cluster.health = self.state
        self.incidents = [Incident(f) for f in self.faults]
        self.outbox: list[XidEvent] = []
        """Events a node agent would have pushed, in virtual seconds; taken by the loop."""
        self.cleared: list[str] = []
        """Nodes a person repaired after a hand-over; taken by the loop (the ladder clears)."""
        self._next_fault = 0
        self._next_flood = 0
        self._last = cluster.time
        self._handed: dict[str, float] = {}
        """Node -> when the ladder handed it over (the person not there yet)."""
        self._fixing: dict[str, tuple[float, bool]] = {}
        """Node -> when the person's repair ends, and whether it was handed over."""
        self._quarantined: set[str] = set()
        """Nodes the engine drained, until they are back in service."""
        self.flood_events = 0
        self.job_crashes = 0
        self.crash_gpu_s = 0.0
        self.drain_gpu_s = 0.0
        self.out_gpu_s = 0.0
        self.faulty_gpu_s = 0.0
        self.capacity_gpu_s = 0.0
        self.held_gpu_s = 0.0
        self.quarantines = {True: 0, False: 0}
        self.attempts = {"reset_gpu": 0, "reboot": 0}
        self.hand_overs = 0
        self.person_repairs = 0

    # --- told by the what-if's loop (the policies-on run) -------------------------------------
    def take_events(self) -> list[XidEvent]:
        events, self.outbox = self.outbox, []
        return events

    def take_cleared(self) -> list[str]:
        nodes, self.cleared = self.cleared, []
        return nodes

    def quarantined(self, node: str, at: float, changed: Mapping[str, object]) -> None:
        """The engine drained ``node`` at virtual second ``at`` (``changed``: what the fleet's
        ``migrate`` answered, the restarts of the jobs it stopped among it): a true quarantine
        while the node has an open fault, whose incidents left service then."""
        self.quarantines[self.state.faulty(node)] += 1
        self._quarantined.add(node)
        self.drain_gpu_s += _restart_gpu_s(changed)
        for incident in self.incidents:
            if incident.fault.node == node and incident.out_at is None and incident.fault.at <= at:
                incident.out_at = at

    def attempted(self, step: str) -> None:
        """The ladder ran ``step`` (``reset_gpu``, ``reboot``) on a node."""
        if step in self.attempts:
            self.attempts[step] += 1

    def hand_over(self, node: str, at: float) -> None:
        """The ladder handed ``node`` to a person at virtual second ``at``."""
        if node not in self._handed and node not in self._fixing:
            self._handed[node] = at
            self.hand_overs += 1

    # --- stepped by the fleet ----------------------------------------------------------------
    def step(self, cluster: Cluster) -> None:
        """After each cluster step: what happened to the faults meanwhile."""
        now = cluster.time
        dt = now - self._last
        self._last = now
        self._measure(cluster, dt)
        while self._next_fault < len(self.faults) and self.faults[self._next_fault].at <= now:
            self._open(cluster, self.incidents[self._next_fault])
            self._next_fault += 1
        while self._next_flood < len(self.floods) and self.floods[self._next_flood] <= now:
            self._flood(cluster, self.floods[self._next_flood])
            self._next_flood += 1
        self._black_holes(cluster)
        self._person(cluster, now)
        self._observe(cluster, now)

    def _open(self, cluster: Cluster, incident: Incident) -> None:
        fault = incident.fault
        with cluster.lock:
            node = cluster.nodes.get(fault.node)
            incident.in_service = node is not None and node.schedulable
        self.state.inject(fault)
        ids, charged = strike(cluster, fault)
        self.job_crashes += len(ids)
        self.crash_gpu_s += charged
        if not self.manual:
            self.outbox.append(fault.event())
        log.info(
            "fault at %.0f s: GPU %s on %s, %s (XID %d), healed by %s; crashed %s",
            fault.at,
            fault.gpu,
            fault.node,
            fault.category,
            fault.code,
            fault.fix.value,
            ids,
        )

    def _flood(self, cluster: Cluster, at: float) -> None:
        with cluster.lock:
            nodes = [
                (n.name, n.gpus[0].uuid)
                for n in cluster.nodes.values()
                if n.gpus and not n.idle() and n.schedulable
            ]
        events = app_flood("crashed job", nodes, at, FLOOD_CODE)
        self.flood_events += len(events)
        if not self.manual:
            self.outbox.extend(events)

    def _black_holes(self, cluster: Cluster) -> None:
        """Jobs placed on a faulty GPU of a node in service crash as they start to compute."""
        for faults in list(self.state.open.values()):
            for fault in faults:
                with cluster.lock:
                    node = cluster.nodes.get(fault.node)
                    busy = node is not None and any(
                        g.uuid == fault.gpu and (g.job is not None or g.tenants) for g in node.gpus
                    )
                if busy:
                    ids, charged = strike(cluster, fault, started_only=True)
                    self.job_crashes += len(ids)
                    self.crash_gpu_s += charged

    def _person(self, cluster: Cluster, now: float) -> None:
        """The person on call: notices a faulty node still in service, takes a node handed
        over, repairs it and resumes it."""
        for node, faults in self.state.open.items():
            if not faults or node in self._fixing or node in self._handed:
                continue
            with cluster.lock:
                in_service = cluster.nodes[node].schedulable if node in cluster.nodes else False
            if in_service and now >= min(f.at for f in faults) + self.plan.response_s:
                self._repair(cluster, node, now, handed=False)
        for node, at in list(self._handed.items()):
            if now >= at + self.plan.response_s:
                del self._handed[node]
                self._repair(cluster, node, now, handed=True)
        for node, (until, handed) in list(self._fixing.items()):
            if now >= until:
                del self._fixing[node]
                self.state.replace(node, now)
                ops.resume(cluster, node)
                if handed:
                    self.cleared.append(node)
                log.info("node %s repaired by the person on call at %.0f s", node, now)

    def _repair(self, cluster: Cluster, node: str, now: float, handed: bool) -> None:
        self.drain_gpu_s += _restart_gpu_s(ops.migrate(cluster, node))
        parts = any(f.fix is Fix.REPLACE for f in self.state.open.get(node, []))
        self._fixing[node] = (now + (self.plan.replace_s if parts else self.plan.fix_s), handed)
        self.person_repairs += 1

    def _measure(self, cluster: Cluster, dt: float) -> None:
        """Each GPU-second of the step in one bucket: held by a job, out of service for a
        fault or a quarantine, faulty and free in service, or none of these."""
        if dt <= 0:
            return
        with cluster.lock:
            for node in cluster.nodes.values():
                gpus = len(node.gpus)
                self.capacity_gpu_s += gpus * dt
                held = sum(1 for g in node.gpus if g.job is not None or g.tenants)
                self.held_gpu_s += held * dt
                open_faults = self.state.open.get(node.name)
                if not node.schedulable:
                    if open_faults or node.name in self._quarantined or node.name in self._fixing:
                        self.out_gpu_s += (gpus - held) * dt
                    continue
                self._quarantined.discard(node.name)
                if open_faults:
                    faulty = {f.gpu for f in open_faults}
                    free = [
                        g for g in node.gpus if g.uuid in faulty and g.job is None and not g.tenants
                    ]
                    self.faulty_gpu_s += len(free) * dt

    def _observe(self, cluster: Cluster, now: float) -> None:
        with cluster.lock:
            for incident in self.incidents:
                fault = incident.fault
                if fault.at > now or incident.healthy_at is not None:
                    continue
                node = cluster.nodes.get(fault.node)
                if node is None:
                    continue
                if incident.out_at is None and not node.schedulable:
                    incident.out_at = now
                if node.schedulable and not self.state.faulty(fault.node):
                    incident.healthy_at = now

    def figures(self) -> ReliabilityFigures:
        due = [i for i in self.incidents if i.fault.at <= self._last]
        to_quarantine = tuple(
            i.out_at - i.fault.at for i in due if i.in_service and i.out_at is not None
        )
        to_healthy = tuple(i.healthy_at - i.fault.at for i in due if i.healthy_at is not None)
        return ReliabilityFigures(
            faults=len(due),
            floods=self._next_flood,
            flood_events=self.flood_events,
            job_crashes=self.job_crashes,
            crash_gpu_hours=self.crash_gpu_s / HOUR_S,
            drain_gpu_hours=self.drain_gpu_s / HOUR_S,
            out_gpu_hours=self.out_gpu_s / HOUR_S,
            faulty_gpu_hours=self.faulty_gpu_s / HOUR_S,
            capacity_gpu_hours=self.capacity_gpu_s / HOUR_S,
            held_gpu_hours=self.held_gpu_s / HOUR_S,
            quarantines_true=self.quarantines[True],
            quarantines_false=self.quarantines[False],
            resets=self.attempts["reset_gpu"],
            reboots=self.attempts["reboot"],
            hand_overs=self.hand_overs,
            person_repairs=self.person_repairs,
            to_quarantine_s=to_quarantine,
            to_healthy_s=to_healthy,
            unhealed=sum(1 for i in due if i.healthy_at is None),
        )
