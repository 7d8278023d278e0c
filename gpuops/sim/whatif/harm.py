"""Harm limits: each policy whose cost on the what-if passes a limit the fleet file (or
``--harm-limit``) sets, flagged by name (docs/whatif.md, "Harm limits").

A stop (a session culled, a job restarted elsewhere, a borrower preempted off GPUs a decision
lent) is the policy's whose decision made it; a class's longer mean completion time, its fewer
completed jobs or its sessions' time over their slowdown objective is every policy that acted
on that class's jobs (``gpuops.sim.whatif.attribution``): for the time over the objective,
those that made them run slower (shared their GPUs, capped their clocks); no policy when none
did (the class paid for what the policies did to others). Read by
``gpuops.sim.whatif.report``, ``gpuops.sim.whatif.conclusion`` and ``gpuops.cli.whatif``
(``--fail-on-harm``). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gpuops.sim.fleet.causes import SCHEDULER
from gpuops.sim.fleet.config import HarmLimits
from gpuops.sim.whatif.both import Whatif

LIMITS = {
    "jct_increase": "mean completion time past its limit",
    "over_objective": "sessions over their objective past the limit",
    "non_preemptible_stops": "jobs stopped though not preemptible",
    "completed_decrease": "fewer jobs completed past the limit",
}
"""Each ``HarmLimits`` field in words."""

NO_POLICY = ""
"""The policy of a flag no policy's action explains: none acted on the class's jobs."""


@dataclass(frozen=True)
class Flag:
    """One policy past one limit on one priority class."""

    policy: str
    """The policy that passed it; ``NO_POLICY``: none acted on the class's jobs."""
    priority_class: str
    limit: str
    """The ``HarmLimits`` field passed."""
    text: str
    """What happened, in words, without the policy's name."""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _policies(w: Whatif, priority_class: str, slowed: bool = False) -> tuple[str, ...]:
    found = w.on.attribution.slowed if slowed else w.on.attribution.acted
    return found.get(priority_class, ()) or (NO_POLICY,)


def flags(w: Whatif) -> list[Flag]:
    """Every policy past a limit of ``w.limits``, per priority class and limit."""
    limits, off, on = w.limits, w.off.report, w.on.report
    out: list[Flag] = []
    for pc in sorted(on.classes):
        a, b = off.classes.get(pc), on.classes[pc]
        if a is not None and a.jct_mean_s and b.jct_mean_s is not None:
            change = b.jct_mean_s / a.jct_mean_s - 1.0
            if change > limits.jct_increase:
                text = (
                    f"the mean completion time of priority class {pc} {change:+.1%} "
                    f"(limit +{limits.jct_increase:.0%})"
                )
                out += [Flag(p, pc, "jct_increase", text) for p in _policies(w, pc)]
        if a is not None and a.completed:
            fewer = a.completed - b.completed
            if fewer >= 2 and fewer / a.completed > limits.completed_decrease:
                text = (
                    f"priority class {pc} completed {b.completed} jobs against {a.completed} "
                    f"without the policies ({-fewer / a.completed:+.1%}; limit "
                    f"-{limits.completed_decrease:.0%})"
                )
                out += [Flag(p, pc, "completed_decrease", text) for p in _policies(w, pc)]
        before = (a.over_objective if a is not None else None) or 0.0
        over = b.over_objective
        if over is not None and over > limits.over_objective and over > before:
            text = (
                f"the sessions of priority class {pc} answered slower than their objective "
                f"{over:.1%} of their time (limit {limits.over_objective:.0%}; {before:.1%} "
                "without the policies)"
            )
            out += [Flag(p, pc, "over_objective", text) for p in _policies(w, pc, slowed=True)]
    stopped: dict[tuple[str, str], dict[str, int]] = {}
    for policy, pc, kind, jobs in w.on.attribution.stops:
        if policy != SCHEDULER and pc in w.non_preemptible:
            stopped.setdefault((policy, pc), {})[kind] = jobs
    for (policy, pc), kinds in sorted(stopped.items()):
        total = sum(kinds.values())
        if total > limits.non_preemptible_stops:
            how = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
            text = (
                f"stopped {total} jobs of priority class {pc}, which the fleet file marks "
                f"preemptible: false ({how}; limit {limits.non_preemptible_stops})"
            )
            out.append(Flag(policy, pc, "non_preemptible_stops", text))
    return out


def _named(policy: str) -> str:
    return "no policy acted on its jobs" if policy == NO_POLICY else policy


def sentence(found: Sequence[Flag], limits: HarmLimits) -> str:
    """The conclusion's sentence on the limits: each policy past one, and what it did."""
    if not found:
        return (
            "Harm limits: no policy passed one (a class's mean completion time "
            f"+{limits.jct_increase:.0%}, its sessions' time over their objective "
            f"{limits.over_objective:.0%}, {limits.non_preemptible_stops} stops of a "
            f"non-preemptible class, {limits.completed_decrease:.0%} fewer jobs of a class "
            "completed)."
        )
    by_policy: dict[str, list[str]] = {}
    for f in found:
        by_policy.setdefault(f.policy, []).append(f.text)
    parts = [f"{_named(p)}: {'; '.join(texts)}" for p, texts in sorted(by_policy.items())]
    return "Harm limits passed: " + ". ".join(parts) + "."


def lines(found: Sequence[Flag]) -> list[str]:
    """The table's section: one line per flag."""
    out = ["", "  harm limits passed (policy: what):"]
    if not found:
        return out + ["  none"]
    return out + [f"  FLAG {_named(f.policy)}: {f.text}" for f in found]
