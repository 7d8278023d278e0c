"""The what-if's comparison: the two runs of ``gpuops.sim.whatif`` side by side — overall, per
priority class and per project — as text (``table``) and JSON (``to_json``), and the case
study's targets checked against them (``targets``).

Used by ``gpuops.cli.whatif`` and the benchmark. Pure: it reads ``RunReport`` values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuops.sim.fleet.report import RunReport, p95, waste_rows
from gpuops.sim.reliability import FaultPlan, ReliabilityFigures, ladder_window_s, median
from gpuops.sim.whatif import harm
from gpuops.sim.whatif.both import Whatif
from gpuops.sim.whatif.conclusion import conclusion
from gpuops.sim.whatif.runs import RunResult


@dataclass(frozen=True)
class Target:
    """One of the case study's "done when" figures and whether the run met it."""

    name: str
    wanted: str
    off: float | None
    on: float | None
    met: bool


def _change(off: float | None, on: float | None) -> float | None:
    return None if off is None or on is None or off == 0 else on / off - 1.0


def targets(w: Whatif) -> list[Target]:
    """Utilization over powered GPUs >= 75 % and >= 30 points above off; mean JCT >= 30 %
    lower; energy per completed GPU-hour >= 10 % lower; throughput lost to clock locks <= 3 %.

    The JCT is ``RunReport.jct_mean_s``: culled notebook sessions counted at their whole
    session, as the off run runs them (left out, the on run's mean would lose long sessions
    only: ``jct_completed_mean_s``, shown beside it in the table)."""
    off, on = w.off.report, w.on.report
    u_off, u_on = off.utilization_powered, on.utilization_powered
    jct = _change(off.jct_mean_s, on.jct_mean_s)
    kwh = _change(off.kwh_per_completed_gpu_hour, on.kwh_per_completed_gpu_hour)
    return [
        Target(
            "utilization over powered GPUs",
            ">= 75 % and >= 30 points above off",
            u_off,
            u_on,
            u_off is not None and u_on is not None and u_on >= 0.75 and u_on - u_off >= 0.30,
        ),
        Target(
            "mean job completion time",
            ">= 30 % lower",
            off.jct_mean_s,
            on.jct_mean_s,
            jct is not None and jct <= -0.30,
        ),
        Target(
            "kWh per completed GPU-hour",
            ">= 10 % lower",
            off.kwh_per_completed_gpu_hour,
            on.kwh_per_completed_gpu_hour,
            kwh is not None and kwh <= -0.10,
        ),
        Target(
            "throughput lost to clock locks",
            "<= 3 %",
            off.downclock_loss,
            on.downclock_loss,
            on.downclock_loss <= 0.03,
        ),
    ]


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def hours(v: float | None) -> str:
    return "-" if v is None else f"{v / 3600:.2f} h"


def number(fmt: str) -> Callable[[float | None], str]:
    """``fmt`` applied to a figure; a count (``d``) that is a median between two is shown
    with its half."""

    def show(v: float | None) -> str:
        if v is None:
            return "-"
        if fmt == "d":
            return format(int(v), "d") if float(v).is_integer() else f"{v:.1f}"
        return format(v, fmt)

    return show


def _delta(off: float | None, on: float | None, points: bool = False) -> str:
    if off is None or on is None:
        return "-"
    if points:
        return f"{(on - off) * 100:+.1f} pt"
    change = _change(off, on)
    return "-" if change is None else f"{change:+.1%}"


Row = tuple[str, Callable[[RunReport], float | None], Callable[[float | None], str], bool]
"""label, figure, format, change in points (shares) rather than relative"""

OVERALL: tuple[Row, ...] = (
    ("GPUs powered (mean)", lambda r: r.gpus_mean, number(".1f"), False),
    ("utilization over powered GPUs", lambda r: r.utilization_powered, _pct, True),
    ("  weighted by GPU throughput", lambda r: r.utilization_weighted, _pct, True),
    ("  without work done again", lambda r: r.utilization_powered_net, _pct, True),
    ("  at most, jobs in their pools", lambda r: r.utilization_bound_pools, _pct, True),
    ("  at most, jobs in any pool", lambda r: r.utilization_bound_any_pool, _pct, True),
    ("utilization over allocated GPUs", lambda r: r.utilization_allocated, _pct, True),
    ("allocation ratio", lambda r: r.allocation_ratio, _pct, True),
    ("jobs completed", lambda r: r.jobs_completed, number("d"), False),
    ("notebook sessions culled", lambda r: r.culled, number("d"), False),
    ("jobs queued at end", lambda r: r.jobs_queued_at_end, number("d"), False),
    ("JCT mean, culled sessions whole", lambda r: r.jct_mean_s, hours, False),
    ("JCT mean, completed jobs only", lambda r: r.jct_completed_mean_s, hours, False),
    ("JCT p95, culled sessions whole", lambda r: r.jct_p95_s, hours, False),
    ("JCT mean, unfinished counted", lambda r: r.jct_all_mean_s, hours, False),
    ("queue wait mean", lambda r: r.wait_mean_s, hours, False),
    ("preemptions", lambda r: r.preemptions, number("d"), False),
    ("reclaims", lambda r: r.reclaims, number("d"), False),
    ("GPU-hours reclaimed", lambda r: r.reclaimed_gpu_hours, number(".1f"), False),
    ("energy (kWh)", lambda r: r.energy_kwh, number(".1f"), False),
    ("energy cost", lambda r: r.energy_cost, number(".2f"), False),
    ("rental cost (cloud pools)", lambda r: r.rental_cost, number(".2f"), False),
    ("total cost", lambda r: r.total_cost, number(".2f"), False),
    ("completed jobs' GPU-hours", lambda r: r.completed_gpu_hours, number(".1f"), False),
    ("kWh per completed GPU-hour", lambda r: r.kwh_per_completed_gpu_hour, number(".3f"), False),
    ("work (full-clock GPU-hours)", lambda r: r.work_gpu_hours, number(".1f"), False),
    ("throughput lost to clock locks", lambda r: r.downclock_loss, _pct, True),
    ("throughput lost to GPU sharing", lambda r: r.sharing_loss, _pct, True),
    ("packs", lambda r: r.packs, number("d"), False),
    ("work redone on restarts (GPU-h)", lambda r: r.restart_gpu_hours, number(".1f"), False),
    ("nodes consolidated", lambda r: r.consolidations, number("d"), False),
    ("jobs moved by consolidation", lambda r: r.jobs_moved, number("d"), False),
)


def _times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


_CLASS_FORMATS: dict[str, Callable[[float | None], str]] = {
    "done": number("d"),
    "culled": number("d"),
    "preemptions": number("d"),
    "restarts": number("d"),
    "slowdown p95": _times,
    "over objective": _pct,
}
"""How the per-class rows other than times are shown."""


def _line(label: str, off: str, on: str, change: str) -> str:
    return f"  {label:<34}{off:>12}{on:>12}{change:>12}"


def duration(v: float | None) -> str:
    """Seconds as seconds, minutes or hours, whichever reads best."""
    if v is None:
        return "-"
    if v < 120:
        return f"{v:.0f} s"
    if v < 3600:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.1f} h"


ReliabilityRow = tuple[
    str, Callable[[ReliabilityFigures], float | None], Callable[[float | None], str], bool
]

RELIABILITY: tuple[ReliabilityRow, ...] = (
    ("GPU faults injected", lambda f: f.faults, number("d"), False),
    ("application XID events (floods)", lambda f: f.flood_events, number("d"), False),
    ("job crashes", lambda f: f.job_crashes, number("d"), False),
    ("GPU-hours lost", lambda f: f.lost_gpu_hours, number(".1f"), False),
    ("  work lost to crashes", lambda f: f.crash_gpu_hours, number(".1f"), False),
    ("  work lost to drains", lambda f: f.drain_gpu_hours, number(".1f"), False),
    ("  GPUs out of service", lambda f: f.out_gpu_hours, number(".1f"), False),
    ("  faulty GPUs left in service", lambda f: f.faulty_gpu_hours, number(".1f"), False),
    ("useful GPU time, share of fleet", lambda f: f.useful_share, _pct, True),
    ("quarantines, true", lambda f: f.quarantines_true, number("d"), False),
    ("quarantines, false", lambda f: f.quarantines_false, number("d"), False),
    ("remediation: GPU resets", lambda f: f.resets, number("d"), False),
    ("remediation: reboots", lambda f: f.reboots, number("d"), False),
    ("hand-overs by the ladder", lambda f: f.hand_overs, number("d"), False),
    ("repairs by a person", lambda f: f.person_repairs, number("d"), False),
    ("time to quarantine, median", lambda f: median(f.to_quarantine_s), duration, False),
    ("time to quarantine, p95", lambda f: p95(f.to_quarantine_s), duration, False),
    ("time to healthy service, median", lambda f: median(f.to_healthy_s), duration, False),
    ("time to healthy service, p95", lambda f: p95(f.to_healthy_s), duration, False),
    ("faults not healed at the end", lambda f: f.unhealed, number("d"), False),
)
"""The reliability what-if's rows (``--faults``): label, figure, format, change in points."""


def fault_header(plan: FaultPlan) -> list[str]:
    """What the faults were, in words: the rate and its scale, the floods, the person."""
    r = plan.rates
    drawn = r.expected(1, 3600.0)
    return [
        f"  GPU faults that raise an XID at the {r.base} rate x {r.scale:g}: {drawn:.2e} per "
        f"GPU-hour; {plan.floods_per_day:g} application XID floods a day; the ladder's window "
        f"of remediations {duration(ladder_window_s(plan))} (7 days / {max(r.scale, 1.0):g})",
        f"  a person on call acts {duration(plan.response_s)} after a fault on a node in "
        f"service or a hand-over, and repairs in {duration(plan.fix_s)} "
        f"({duration(plan.replace_s)} for a part)",
    ]


def reliability_lines(w: Whatif) -> list[str]:
    """The reliability section of one seed's table (none without ``--faults``)."""
    a, b = w.off.reliability, w.on.reliability
    if w.faults is None or a is None or b is None:
        return []
    lines = ["", _line("reliability", "off", "on", "change"), *fault_header(w.faults)]
    for label, get, fmt, points in RELIABILITY:
        x, y = get(a), get(b)
        lines.append(_line(label, fmt(x), fmt(y), _delta(x, y, points)))
    return lines


def table(w: Whatif) -> str:
    """Off vs on as aligned text: overall, per priority class, per project, the targets."""
    off, on = w.off.report, w.on.report
    lines = [
        f"what-if {w.fleet}: {w.hours:g} virtual hours, seed {w.seed}, rules {', '.join(w.rules)}",
        _line("", "off", "on", "change"),
    ]
    for label, get, fmt, points in OVERALL:
        a, b = get(off), get(on)
        lines.append(_line(label, fmt(a), fmt(b), _delta(a, b, points)))
    lines += ["", _line("priority class: JCT mean / p95 / wait", "off", "on", "change")]
    for pc in sorted(set(off.classes) | set(on.classes)):
        ca, cb = off.classes.get(pc), on.classes.get(pc)
        for what, get in (
            ("done", lambda c: c.completed),
            ("culled", lambda c: c.culled),
            ("preemptions", lambda c: c.preemptions),
            ("restarts", lambda c: c.restarts),
            ("JCT mean", lambda c: c.jct_mean_s),
            ("JCT p95", lambda c: c.jct_p95_s),
            ("wait mean", lambda c: c.wait_mean_s),
            ("wait p95", lambda c: c.wait_p95_s),
            ("slowdown p95", lambda c: c.slowdown_p95),
            ("over objective", lambda c: c.over_objective),
        ):
            x = None if ca is None else get(ca)
            y = None if cb is None else get(cb)
            fmt = _CLASS_FORMATS.get(what, hours)
            lines.append(_line(f"{pc} {what}", fmt(x), fmt(y), _delta(x, y)))
    lines += ["", _line("project", "off", "on", "change")]
    for p in sorted(set(off.projects) | set(on.projects)):
        pa, pb = off.projects.get(p), on.projects.get(p)
        for what, get, fmt, points in (
            ("util (allocated)", lambda f: f.utilization_allocated, _pct, True),
            ("GPU-hours allocated", lambda f: f.allocated_gpu_hours, number(".1f"), False),
            ("done", lambda f: f.completed, number("d"), False),
            ("JCT mean", lambda f: f.jct_mean_s, hours, False),
            ("preemptions", lambda f: f.preemptions, number("d"), False),
        ):
            x = None if pa is None else get(pa)
            y = None if pb is None else get(pb)
            lines.append(_line(f"{p} {what}", fmt(x), fmt(y), _delta(x, y, points)))
    lines += ["", _line("pool: powered GPU-h / util over them", "off", "on", "change")]
    for name in sorted(set(off.pools) | set(on.pools)):
        qa, qb = off.pools.get(name), on.pools.get(name)
        for what, get, fmt, points in (
            ("powered GPU-h", lambda f: f.powered_gpu_hours, number(".1f"), False),
            ("util (powered)", lambda f: f.utilization_powered, _pct, True),
            ("util (powered) at most", lambda f: f.utilization_bound, _pct, True),
            ("allocated GPU-h", lambda f: f.allocated_gpu_hours, number(".1f"), False),
            ("util (allocated)", lambda f: f.utilization_allocated, _pct, True),
        ):
            x = None if qa is None else get(qa)
            y = None if qb is None else get(qb)
            lines.append(_line(f"{name} {what}", fmt(x), fmt(y), _delta(x, y, points)))
    lines += ["", _line("powered GPU-hours not busy", "off", "on", "change")]
    a, b = off.waste.total(), on.waste.total()
    lines.append(_line("total", f"{a:.1f}", f"{b:.1f}", _delta(a, b)))
    rows_off, rows_on = dict(waste_rows(off.waste)), dict(waste_rows(on.waste))
    for label in sorted(set(rows_off) | set(rows_on), key=_waste_order):
        x, y = rows_off.get(label), rows_on.get(label)
        fmt = number(".1f")
        lines.append(_line(label, fmt(x), fmt(y), _delta(x, y)))
    lines += ["", _line("energy by draw (kWh)", "off", "on", "change")]
    for label in sorted(set(off.energy_split_kwh) | set(on.energy_split_kwh)):
        x, y = off.energy_split_kwh.get(label), on.energy_split_kwh.get(label)
        lines.append(_line(label, number(".1f")(x), number(".1f")(y), _delta(x, y)))
    lines += ["", "  targets (on the case-study fleet):"]
    for t in targets(w):
        fmt = (
            hours
            if "time" in t.name
            else (_pct if t.name.startswith(("util", "through")) else number(".3f"))
        )
        lines.append(
            f"  {'met    ' if t.met else 'NOT met'} {t.name} {t.wanted}: "
            f"off {fmt(t.off)}, on {fmt(t.on)}"
        )
    lines += harm.lines(harm.flags(w))
    lines += reliability_lines(w)
    if w.on.rollout is not None:
        lines += ["", *(f"  {line}" for line in w.on.rollout.lines())]
        lines.append("  (the on run's figures hold the rollout's cost with the policies' effect)")
    lines += [
        "",
        f"  run time: off {w.off.wall_s:.1f} s, on {w.on.wall_s:.1f} s",
        "  actions of the on run: "
        + (", ".join(f"{k} {v}" for k, v in sorted(w.on.outcomes.items())) or "none"),
    ]
    return "\n".join(lines + conclusion(w))


def _waste_order(label: str) -> tuple[int, str]:
    kinds = ("unallocated", "held whole", "shared,", "shared unused")
    return (next((i for i, k in enumerate(kinds) if label.startswith(k)), len(kinds)), label)


def _run_json(r: RunResult) -> dict[str, Any]:
    return {
        "report": r.report.to_json(),
        "wall_s": r.wall_s,
        "decisions": r.decisions,
        "outcomes": r.outcomes,
        "attribution": r.attribution.to_json(),
        **({} if r.rollout is None else {"rollout": r.rollout.to_json()}),
        **({} if r.reliability is None else {"reliability": r.reliability.as_dict()}),
    }


def to_json(w: Whatif) -> dict[str, Any]:
    return {
        "fleet": w.fleet,
        "hours": w.hours,
        "seed": w.seed,
        "rules": list(w.rules),
        "off": _run_json(w.off),
        "on": _run_json(w.on),
        "targets": [t.__dict__ for t in targets(w)],
        "harm_limits": w.limits.__dict__,
        "harm": [f.to_json() for f in harm.flags(w)],
        **({} if w.faults is None else {"faults": fault_json(w.faults)}),
    }


def fault_json(plan: FaultPlan) -> dict[str, Any]:
    return {
        "base": plan.rates.base,
        "scale": plan.rates.scale,
        "per_gpu_hour": plan.rates.per_gpu_hour,
        "floods_per_day": plan.floods_per_day,
        "response_s": plan.response_s,
        "fix_s": plan.fix_s,
        "replace_s": plan.replace_s,
    }
