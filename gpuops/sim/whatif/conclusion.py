"""The what-if's conclusion in plain words: what the policies gained, what they cost, and who
paid — for one seed, and over several (each claim with the seeds it holds on).

Used by ``gpuops.sim.whatif.report`` and ``gpuops.sim.whatif.spread`` at the end of their
tables. Pure: it reads the ``RunReport`` of both runs.
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Callable, Sequence

from gpuops.sim.fleet.report import RunReport
from gpuops.sim.whatif import harm
from gpuops.sim.whatif.both import Whatif

HARM_MARGIN = 0.05
"""A priority class or project whose mean completion time rises by more than this share paid
for the gain (and is named)."""


def _rel(off: float | None, on: float | None) -> float | None:
    return None if off is None or on is None or off == 0 else on / off - 1.0


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def _wrap(sentences: list[str]) -> list[str]:
    out = ["", "  conclusion:"]
    for sentence in sentences:
        out += textwrap.wrap(sentence, 96, initial_indent="  ", subsequent_indent="    ")
    return out


def _gains(off: RunReport, on: RunReport) -> str:
    u_off, u_on = off.utilization_powered, on.utilization_powered
    if u_off is None or u_on is None:
        return "No GPU was powered in one of the runs: nothing to compare."
    verb = "raised" if u_on >= u_off else "lowered"
    text = (
        f"The policies {verb} utilization over powered GPUs from {u_off:.1%} to {u_on:.1%} "
        f"({(u_on - u_off) * 100:+.1f} points"
    )
    if off.utilization_weighted is not None and on.utilization_weighted is not None:
        text += (
            f"; weighted by GPU throughput {off.utilization_weighted:.1%} to "
            f"{on.utilization_weighted:.1%}"
        )
    text += f") with {on.gpus_mean:.1f} GPUs powered on average instead of {off.gpus_mean:.1f}."
    jct = _rel(off.jct_mean_s, on.jct_mean_s)
    if jct is not None:
        text += (
            f" Jobs took {abs(jct):.1%} {'less' if jct <= 0 else 'more'} time from submit to "
            f"end on average (queue wait {_h(off.wait_mean_s)} to {_h(on.wait_mean_s)})."
        )
    kwh = _rel(off.kwh_per_completed_gpu_hour, on.kwh_per_completed_gpu_hour)
    if kwh is not None:
        text += f" Energy per completed GPU-hour {'fell' if kwh <= 0 else 'rose'} {abs(kwh):.1%}"
    cost = _rel(off.total_cost, on.total_cost)
    if cost is not None:
        text += (
            f"; the total cost (energy {on.energy_cost:.2f} and rental {on.rental_cost:.2f} "
            f"{on.currency}) {'fell' if cost <= 0 else 'rose'} {abs(cost):.1%}."
        )
    return text


def _costs(off: RunReport, on: RunReport) -> str:
    parts = [
        f"{on.culled} notebook sessions culled",
        f"preemptions {off.preemptions} to {on.preemptions}",
        f"{on.jobs_moved} jobs moved by consolidation",
        f"{on.restart_gpu_hours:.1f} GPU-hours relaunched or redone after restarts",
        f"{on.sharing_loss:.1%} of throughput lost to GPU sharing",
        f"{on.downclock_loss:.1%} to clock locks",
    ]
    return "What it cost: " + ", ".join(parts) + "."


def _payers(off: RunReport, on: RunReport) -> str:
    paid: list[str] = []
    for pc in sorted(set(off.classes) & set(on.classes)):
        a, b = off.classes[pc], on.classes[pc]
        change = _rel(a.jct_mean_s, b.jct_mean_s)
        if change is not None and change > HARM_MARGIN:
            paid.append(
                f"priority class {pc} (mean completion {_h(a.jct_mean_s)} to "
                f"{_h(b.jct_mean_s)}, {change:+.1%}; {b.culled} sessions culled)"
            )
    for pc in sorted(on.classes):
        b = on.classes[pc]
        before = off.classes[pc].slowdown_p95 if pc in off.classes else None
        if b.slowdown_p95 is not None and b.slowdown_p95 > (before or 1.0) * (1 + HARM_MARGIN):
            text = (
                f"the sessions of priority class {pc} (answers {b.slowdown_p95:.2f}x as slow at "
                f"the 95th percentile, from {before or 1.0:.2f}x"
            )
            if b.over_objective is not None:
                text += f"; {b.over_objective:.1%} of their time over their objective"
            paid.append(text + ")")
    for p in sorted(set(off.projects) & set(on.projects)):
        a2, b2 = off.projects[p], on.projects[p]
        change = _rel(a2.jct_mean_s, b2.jct_mean_s)
        if change is not None and change > HARM_MARGIN:
            paid.append(
                f"project {p} ({change:+.1%} mean completion, preemptions "
                f"{a2.preemptions} to {b2.preemptions})"
            )
    if not paid:
        return (
            f"Who paid: no priority class or project saw its mean completion time rise by more "
            f"than {HARM_MARGIN:.0%}."
        )
    return "Who paid: " + "; ".join(paid) + "."


def conclusion(w: Whatif) -> list[str]:
    """The lines that end the one-seed table."""
    off, on = w.off.report, w.on.report
    return _wrap(
        [_gains(off, on), _costs(off, on), _payers(off, on), harm.sentence(harm.flags(w), w.limits)]
    )


def _over(
    runs: Sequence[Whatif], get: Callable[[RunReport], float | None], points: bool
) -> tuple[float, float, float, int, int] | None:
    """(median, lowest, highest change, seeds where it rose, seeds that had it)."""
    changes = []
    for w in runs:
        a, b = get(w.off.report), get(w.on.report)
        if a is None or b is None:
            continue
        change = b - a if points else _rel(a, b)
        if change is not None:
            changes.append(change)
    if not changes:
        return None
    up = sum(1 for c in changes if c > 0)
    return statistics.median(changes), min(changes), max(changes), up, len(changes)


def conclusion_over_seeds(runs: Sequence[Whatif]) -> list[str]:
    """The lines that end the table over seeds: each claim as a median, its range and the
    seeds it holds on."""
    n = len(runs)
    sentences = []
    for label, get, points in (
        ("utilization over powered GPUs", lambda r: r.utilization_powered, True),
        ("utilization weighted by GPU throughput", lambda r: r.utilization_weighted, True),
        ("mean completion time", lambda r: r.jct_mean_s, False),
        ("energy per completed GPU-hour", lambda r: r.kwh_per_completed_gpu_hour, False),
        ("total cost (energy and rental)", lambda r: r.total_cost, False),
        ("preemptions", lambda r: float(r.preemptions), False),
    ):
        found = _over(runs, get, points)
        if found is None:
            continue
        median, low, high, up, seeds = found
        fmt = _points if points else _share
        sentences.append(
            f"{label[0].upper() + label[1:]}: {fmt(median)} (median; {fmt(low)} to "
            f"{fmt(high)}), up on {up} of {seeds} seeds."
        )
    culled = [w.on.report.culled for w in runs]
    sentences.append(
        f"Notebook sessions culled: {statistics.median(culled):g} (median; {min(culled)} to "
        f"{max(culled)}) of {n} seeds' days."
    )
    paid = []
    classes = sorted({pc for w in runs for pc in w.off.report.classes})
    for pc in classes:
        found = _over(runs, _class_jct(pc), False)
        if found is not None and found[0] > HARM_MARGIN:
            median, low, high, up, seeds = found
            paid.append(
                f"priority class {pc}, mean completion {median:+.1%} (median; {low:+.1%} to "
                f"{high:+.1%}), longer on {up} of {seeds} seeds"
            )
    sentences.append(
        "Who paid: " + "; ".join(paid) + "."
        if paid
        else f"Who paid: no priority class's mean completion time rose by more than "
        f"{HARM_MARGIN:.0%} (median over the seeds)."
    )
    sentences.append(_harm_over_seeds(runs))
    return _wrap(sentences)


def _harm_over_seeds(runs: Sequence[Whatif]) -> str:
    """Each policy past a harm limit, with the seeds it passed it on."""
    seeds: dict[tuple[str, str, str], list[int]] = {}
    for w in runs:
        for f in {(f.policy, f.priority_class, f.limit) for f in harm.flags(w)}:
            seeds.setdefault(f, []).append(w.seed)
    if not seeds:
        return harm.sentence([], runs[0].limits)
    parts = []
    for (policy, pc, limit), found in sorted(seeds.items()):
        who = policy or "no policy acted on its jobs"
        listed = ", ".join(map(str, found))
        parts.append(
            f"{who}: priority class {pc}, {harm.LIMITS[limit]}, on {len(found)} of "
            f"{len(runs)} seeds ({listed})"
        )
    return "Harm limits passed: " + "; ".join(parts) + "."


def _class_jct(pc: str) -> Callable[[RunReport], float | None]:
    def get(report: RunReport) -> float | None:
        figures = report.classes.get(pc)
        return None if figures is None else figures.jct_mean_s

    return get


def _points(v: float) -> str:
    return f"{v * 100:+.1f} pt"


def _share(v: float) -> str:
    return f"{v:+.1%}"
