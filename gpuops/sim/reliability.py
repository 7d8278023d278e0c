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
- a person on call: without gpuops (``manual``) notices a faulty node ``response_s`` after its
  fault, drains it and repairs it (``fix_s``; a part to replace ``replace_s``), then resumes
  it; with gpuops the person acts only on the nodes the remediation ladder handed over
  (``hand_over``), as fast, and clears them (``cleared``) for the engine.

It measures what ``ReliabilityFigures`` holds: GPU-hours lost (work lost to crashes, GPUs out
of service, faulty GPUs left in service), the share of the GPU-hours jobs held that was not
lost to a crash, quarantines (true and false: told by the what-if's decision listener through
``quarantined``), remediation attempts, hand-overs, and each incident's time to quarantine and
to return. Nothing here decides anything: the engine does, in the policies-on run.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
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
    """From a fault (without gpuops) or a hand-over (with) to a person acting on the node."""
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


@dataclass
class Incident:
    """One injected fault and what became of it."""

    fault: InjectedFault
    out_at: float | None = None
    """When its node first left service after it (drained or being repaired)."""
    back_at: float | None = None
    """When its node was back in service with the fault healed."""


@dataclass(frozen=True)
class ReliabilityFigures:
    """What the faults cost one run (``Injector.figures``)."""

    faults: int
    floods: int
    """Floods of an application XID (each one event per node that ran jobs)."""
    flood_events: int
    jobs_crashed: int
    """Job crashes: at a fault, and on a faulty GPU left in service."""
    crash_gpu_hours: float
    """Work lost to crashes (since the last checkpoint) and the relaunches, GPU-hours."""
    out_gpu_hours: float
    """GPU-hours of nodes out of service (drained, being repaired) after a fault or a
    quarantine."""
    faulty_gpu_hours: float
    """GPU-hours of faulty GPUs left in service (nothing runs on them that lasts)."""
    held_gpu_hours: float
    """GPU-hours jobs held."""
    quarantines_true: int
    quarantines_false: int
    """Quarantines of a node with no open fault (a flood, a fault healed meanwhile)."""
    resets: int
    reboots: int
    hand_overs: int
    """Nodes handed to a person (by the ladder; without gpuops every fault is)."""
    to_quarantine_s: tuple[float, ...]
    """Per incident whose node left service: from the fault to then."""
    to_return_s: tuple[float, ...]
    """Per incident whose node came back: from leaving service to back, healed."""
    unreturned: int
    """Incidents whose node was still out, or still faulty, at the end."""

    @property
    def lost_gpu_hours(self) -> float:
        return self.crash_gpu_hours + self.out_gpu_hours + self.faulty_gpu_hours

    @property
    def effective_training(self) -> float | None:
        """The share of the GPU-hours jobs held that was not lost to a crash."""
        if self.held_gpu_hours <= 0:
            return None
        return max(0.0, 1.0 - self.crash_gpu_hours / self.held_gpu_hours)

    def as_dict(self) -> dict[str, object]:
        return {
            "faults": self.faults,
            "floods": self.floods,
            "flood_events": self.flood_events,
            "jobs_crashed": self.jobs_crashed,
            "lost_gpu_hours": round(self.lost_gpu_hours, 2),
            "crash_gpu_hours": round(self.crash_gpu_hours, 2),
            "out_gpu_hours": round(self.out_gpu_hours, 2),
            "faulty_gpu_hours": round(self.faulty_gpu_hours, 2),
            "held_gpu_hours": round(self.held_gpu_hours, 2),
            "effective_training": _round(self.effective_training, 4),
            "quarantines_true": self.quarantines_true,
            "quarantines_false": self.quarantines_false,
            "resets": self.resets,
            "reboots": self.reboots,
            "hand_overs": self.hand_overs,
            "to_quarantine_median_s": _round(_median(self.to_quarantine_s), 1),
            "to_quarantine_p95_s": _round(p95(self.to_quarantine_s), 1),
            "to_return_median_s": _round(_median(self.to_return_s), 1),
            "to_return_p95_s": _round(p95(self.to_return_s), 1),
            "unreturned": self.unreturned,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _median(values: tuple[float, ...]) -> float | None:
    return statistics.median(values) if values else None


def p95(values: tuple[float, ...]) -> float | None:
    """The 95th percentile (nearest rank), None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


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
        """``manual``: no gpuops (the person acts on every fault); else the person acts on
        what the ladder hands over. The faults and floods come from ``seed`` alone, so both
        runs of a what-if get the same ones (``drawn``: these faults and flood times
        instead)."""
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
        self._fixing: dict[str, float] = {}
        """Node -> when the person's repair ends."""
        self.flood_events = 0
        self.jobs_crashed = 0
        self.crash_gpu_s = 0.0
        self.out_gpu_s = 0.0
        self.faulty_gpu_s = 0.0
        self.held_gpu_s = 0.0
        self.quarantines = {True: 0, False: 0}
        self.attempts = {"reset_gpu": 0, "reboot": 0}
        self.hand_overs = 0

    # --- told by the what-if's loop (the policies-on run) -------------------------------------
    def take_events(self) -> list[XidEvent]:
        events, self.outbox = self.outbox, []
        return events

    def take_cleared(self) -> list[str]:
        nodes, self.cleared = self.cleared, []
        return nodes

    def quarantined(self, node: str, at: float) -> None:
        """The engine quarantined ``node`` at virtual second ``at`` (a true quarantine while
        the node has an open fault, whose incident left service then)."""
        self.quarantines[self.state.faulty(node)] += 1
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
            self._open(cluster, self.faults[self._next_fault])
            self._next_fault += 1
        while self._next_flood < len(self.floods) and self.floods[self._next_flood] <= now:
            self._flood(cluster, self.floods[self._next_flood])
            self._next_flood += 1
        self._black_holes(cluster)
        self._person(cluster, now)
        self._observe(cluster, now)

    def _open(self, cluster: Cluster, fault: InjectedFault) -> None:
        self.state.inject(fault)
        ids, charged = strike(cluster, fault)
        self.jobs_crashed += len(ids)
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
        """Jobs placed on a faulty GPU of a node in service crash."""
        for faults in list(self.state.open.values()):
            for fault in faults:
                with cluster.lock:
                    node = cluster.nodes.get(fault.node)
                    busy = node is not None and any(
                        g.uuid == fault.gpu and (g.job is not None or g.tenants) for g in node.gpus
                    )
                if busy:
                    ids, charged = strike(cluster, fault, started_only=True)
                    self.jobs_crashed += len(ids)
                    self.crash_gpu_s += charged

    def _person(self, cluster: Cluster, now: float) -> None:
        """The person on call: notices, drains, repairs, resumes."""
        if self.manual:
            for node, faults in self.state.open.items():
                if faults and node not in self._fixing:
                    first = min(f.at for f in faults)
                    if now >= first + self.plan.response_s:
                        self._repair(cluster, node, now)
        else:
            for node, at in list(self._handed.items()):
                if now >= at + self.plan.response_s:
                    del self._handed[node]
                    self._repair(cluster, node, now)
        for node, until in list(self._fixing.items()):
            if now >= until:
                del self._fixing[node]
                self.state.replace(node, now)
                ops.resume(cluster, node)
                if not self.manual:
                    self.cleared.append(node)
                log.info("node %s repaired by the person on call at %.0f s", node, now)

    def _repair(self, cluster: Cluster, node: str, now: float) -> None:
        ops.migrate(cluster, node)
        parts = any(f.fix is Fix.REPLACE for f in self.state.open.get(node, []))
        self._fixing[node] = now + (self.plan.replace_s if parts else self.plan.fix_s)
        if self.manual:
            self.hand_overs += 1

    def _measure(self, cluster: Cluster, dt: float) -> None:
        if dt <= 0:
            return
        with cluster.lock:
            for node in cluster.nodes.values():
                held = sum(1 for g in node.gpus if g.job is not None or g.tenants)
                self.held_gpu_s += held * dt
                if not node.schedulable and not node.failed:
                    self.out_gpu_s += len(node.gpus) * dt
                elif self.state.open.get(node.name):
                    self.faulty_gpu_s += len({f.gpu for f in self.state.open[node.name]}) * dt

    def _observe(self, cluster: Cluster, now: float) -> None:
        with cluster.lock:
            for incident in self.incidents:
                fault = incident.fault
                if fault.at > now or incident.back_at is not None:
                    continue
                node = cluster.nodes.get(fault.node)
                if node is None:
                    continue
                if incident.out_at is None:
                    if not node.schedulable:
                        incident.out_at = now
                elif node.schedulable and not self.state.faulty(fault.node):
                    incident.back_at = now

    def figures(self) -> ReliabilityFigures:
        to_quarantine = tuple(i.out_at - i.fault.at for i in self.incidents if i.out_at is not None)
        to_return = tuple(
            i.back_at - i.out_at
            for i in self.incidents
            if i.back_at is not None and i.out_at is not None
        )
        due = [i for i in self.incidents if i.fault.at <= self._last]
        return ReliabilityFigures(
            faults=len(due),
            floods=self._next_flood,
            flood_events=self.flood_events,
            jobs_crashed=self.jobs_crashed,
            crash_gpu_hours=self.crash_gpu_s / HOUR_S,
            out_gpu_hours=self.out_gpu_s / HOUR_S,
            faulty_gpu_hours=self.faulty_gpu_s / HOUR_S,
            held_gpu_hours=self.held_gpu_s / HOUR_S,
            quarantines_true=self.quarantines[True],
            quarantines_false=self.quarantines[False],
            resets=self.attempts["reset_gpu"],
            reboots=self.attempts["reboot"],
            hand_overs=self.hand_overs,
            to_quarantine_s=to_quarantine,
            to_return_s=to_return,
            unreturned=sum(1 for i in due if i.back_at is None),
        )
