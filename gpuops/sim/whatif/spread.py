"""The what-if over several seeds: each figure as its median and range, off, on and the change,
so that no claim rests on one seed's workload.

Used by ``gpuops.cli.whatif`` (``--seeds``). Pure: it reads the ``Whatif`` of every seed and
the rows ``gpuops.sim.whatif.report`` shows for one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuops.sim.fleet.report import RunReport
from gpuops.sim.whatif.both import Whatif
from gpuops.sim.whatif.conclusion import conclusion_over_seeds
from gpuops.sim.whatif.report import (
    OVERALL,
    RELIABILITY,
    Row,
    fault_header,
    fault_json,
    hours,
    number,
    to_json,
)


@dataclass(frozen=True)
class Spread:
    """The median and the range of one figure over the seeds that have it."""

    median: float
    low: float
    high: float
    seeds: int
    """How many seeds had the figure (a run with no completed job has no JCT)."""

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread | None:
        known = [v for v in values if v is not None]
        if not known:
            return None
        return cls(statistics.median(known), min(known), max(known), len(known))

    def to_json(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "seeds": self.seeds}


@dataclass(frozen=True)
class Figure:
    """One row of the report over the seeds: off, on, and the change seed by seed (points for
    shares, relative otherwise)."""

    label: str
    off: Spread | None
    on: Spread | None
    change: Spread | None
    points: bool
    fmt: Callable[[float | None], str]


def _change(off: float | None, on: float | None, points: bool) -> float | None:
    if off is None or on is None:
        return None
    if points:
        return on - off
    return None if off == 0 else on / off - 1.0


def _figure(
    runs: Sequence[Whatif], label: str, get: Callable[[RunReport], Any], fmt: Any, points: bool
) -> Figure:
    offs = [_float(get(w.off.report)) for w in runs]
    ons = [_float(get(w.on.report)) for w in runs]
    changes = [_change(a, b, points) for a, b in zip(offs, ons, strict=True)]
    return Figure(label, Spread.of(offs), Spread.of(ons), Spread.of(changes), points, fmt)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _class_rows(runs: Sequence[Whatif]) -> list[Row]:
    names = sorted({pc for w in runs for r in (w.off, w.on) for pc in r.report.classes})
    rows: list[Row] = []
    for pc in names:
        for what, attr, fmt in (
            ("done", "completed", number("d")),
            ("culled", "culled", number("d")),
            ("preemptions", "preemptions", number("d")),
            ("restarts", "restarts", number("d")),
            ("JCT mean", "jct_mean_s", hours),
            ("wait mean", "wait_mean_s", hours),
            ("slowdown p95", "slowdown_p95", number(".2f")),
            ("over objective", "over_objective", number(".3f")),
        ):
            rows.append((f"{pc} {what}", _class_getter(pc, attr), fmt, False))
    return rows


def _class_getter(pc: str, attr: str) -> Callable[[RunReport], float | None]:
    def get(report: RunReport) -> float | None:
        figures = report.classes.get(pc)
        return None if figures is None else getattr(figures, attr)

    return get


def reliability(runs: Sequence[Whatif]) -> list[Figure]:
    """The reliability rows over ``runs`` (none without ``--faults``)."""
    if any(w.off.reliability is None or w.on.reliability is None for w in runs):
        return []
    found: list[Figure] = []
    for label, get, fmt, points in RELIABILITY:
        offs = [_float(get(w.off.reliability)) for w in runs if w.off.reliability is not None]
        ons = [_float(get(w.on.reliability)) for w in runs if w.on.reliability is not None]
        changes = [_change(a, b, points) for a, b in zip(offs, ons, strict=True)]
        spreads = Spread.of(offs), Spread.of(ons), Spread.of(changes)
        found.append(Figure(label, *spreads, points, fmt))
    return found


def figures(runs: Sequence[Whatif]) -> list[Figure]:
    """Every overall row of the one-seed report, then per priority class its completions,
    culls, preemptions, restarts, JCT, wait and serving quality, each over ``runs``."""
    return [_figure(runs, *row) for row in (*OVERALL, *_class_rows(runs))]


def _cell(spread: Spread | None, fmt: Callable[[float | None], str]) -> str:
    if spread is None:
        return "-"
    if spread.low == spread.high:
        return fmt(spread.median)

    shown = fmt(spread.median)

    def bare(v: float) -> str:  # the range without the unit the median shows, if the same
        text = fmt(v)
        for unit in (" pt", " h", " min", " s"):
            if text.endswith(unit) and shown.endswith(unit):
                return text.removesuffix(unit)
        return text

    return f"{fmt(spread.median)} [{bare(spread.low)}, {bare(spread.high)}]"


def _change_fmt(points: bool) -> Callable[[float | None], str]:
    if points:
        return lambda v: "-" if v is None else f"{v * 100:+.1f} pt"
    return lambda v: "-" if v is None else f"{v:+.1%}"


def _line(label: str, off: str, on: str, change: str) -> str:
    return f"  {label:<34}{off:>25} {on:>25} {change:>25}"


def table(runs: Sequence[Whatif]) -> str:
    """Every figure as ``median [lowest, highest]`` over the seeds, off, on and the change."""
    first = runs[0]
    seeds = ", ".join(str(w.seed) for w in runs)
    lines = [
        f"what-if {first.fleet}: {first.hours:g} virtual hours, {len(runs)} seeds ({seeds}), "
        f"rules {', '.join(first.rules)}",
        "  each figure: median [lowest, highest] over the seeds; the change is taken seed by seed",
        _line("", "off", "on", "change"),
    ]
    lines += _rows(figures(runs), len(runs))
    faulted = reliability(runs)
    if faulted and first.faults is not None:
        lines += ["", _line("reliability", "off", "on", "change"), *fault_header(first.faults)]
        lines += _rows(faulted, len(runs))
    for w in runs:
        if w.on.rollout is not None:
            lines += ["", f"  seed {w.seed}:", *(f"  {line}" for line in w.on.rollout.lines())]
    wall = sum(w.off.wall_s + w.on.wall_s for w in runs)
    lines += ["", f"  run time: {wall:.1f} s over {len(runs)} seeds (off and on runs together)"]
    return "\n".join(lines + conclusion_over_seeds(runs))


def _rows(found: Sequence[Figure], seeds: int) -> list[str]:
    lines = []
    for f in found:
        change = _cell(f.change, _change_fmt(f.points))
        if f.change is not None and f.change.seeds < seeds:  # off was 0 on some seeds
            change += f" ({f.change.seeds} seeds)"
        lines.append(_line(f.label, _cell(f.off, f.fmt), _cell(f.on, f.fmt), change))
    return lines


def _figures_json(found: Sequence[Figure]) -> list[dict[str, Any]]:
    return [
        {
            "name": f.label,
            "change_in": "points" if f.points else "relative",
            **{
                k: None if s is None else s.to_json()
                for k, s in (("off", f.off), ("on", f.on), ("change", f.change))
            },
        }
        for f in found
    ]


def to_json_spread(runs: Sequence[Whatif]) -> dict[str, Any]:
    """The spreads and every seed's own comparison (``gpuops.sim.whatif.report.to_json``)."""
    return {
        "seeds": [w.seed for w in runs],
        "figures": _figures_json(figures(runs)),
        **(
            {}
            if runs[0].faults is None
            else {
                "faults": fault_json(runs[0].faults),
                "reliability": _figures_json(reliability(runs)),
            }
        ),
        "runs": [to_json(w) for w in runs],
    }
