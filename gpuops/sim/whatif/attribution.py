"""The costs of the policies-on run attributed to policies: the fleet's record of which
decision stopped or acted on which jobs (``gpuops.sim.fleet.causes``), its decisions named
by their policies.

Built by ``gpuops.sim.whatif.runs`` at the end of the on run; read by
``gpuops.sim.whatif.harm``. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuops.sim.fleet.causes import SCHEDULER, Causes

Stops = tuple[tuple[str, str, str, int], ...]
"""(policy, priority class, kind, jobs): ``kind`` as ``gpuops.sim.fleet.causes.Stop``;
policy ``""``: the fleet's own scheduler."""


@dataclass(frozen=True)
class Attribution:
    """Who stopped which jobs, and which policies acted on each priority class's jobs."""

    stops: Stops = ()
    acted: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Priority class -> the policies that acted on its jobs, by name."""
    slowed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Priority class -> the policies that made its jobs run slower (sharing, clock caps)."""

    def to_json(self) -> dict[str, object]:
        return {
            "stops": [
                {"policy": p, "priority_class": pc, "kind": kind, "jobs": jobs}
                for p, pc, kind, jobs in self.stops
            ],
            "acted": {pc: list(p) for pc, p in self.acted.items()},
            "slowed": {pc: list(p) for pc, p in self.slowed.items()},
        }


def attribute(causes: Causes, policies: Mapping[str, str]) -> Attribution:
    """``causes`` with each decision id named by its policy (``policies``: id -> policy; an
    id the run never decided, which cannot happen in a what-if, is named as it is)."""

    def name(decision: str) -> str:
        return SCHEDULER if decision == SCHEDULER else policies.get(decision, decision)

    stops: Counter[tuple[str, str, str]] = Counter()
    for stop, jobs in causes.stops.items():
        stops[(name(stop.decision), stop.priority_class, stop.kind)] += jobs

    def named(found: Mapping[str, set[str]]) -> dict[str, tuple[str, ...]]:
        return {pc: tuple(sorted({name(d) for d in ids})) for pc, ids in sorted(found.items())}

    return Attribution(
        tuple(sorted((p, pc, kind, jobs) for (p, pc, kind), jobs in stops.items())),
        named(causes.acted),
        named(causes.slowed),
    )
