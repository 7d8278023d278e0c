"""Line charts as inline SVG, drawn on the server: the console runs no script (its CSP says
``script-src 'none'``), so the Timeline's utilization and queue charts are markup. Colours come
from classes in ``console.css`` (inline styles would break the CSP's ``style-src 'self'``).

Pure: values in, ``Markup`` out, every label escaped. Used by ``gpuops.api.console.fleet``.
A few lines of SVG are all a chart needs here; a plotting library would bring a renderer,
fonts and a script-free mode to configure for the same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from markupsafe import Markup, escape

Unit = Literal["ratio", "count"]

WIDTH, HEIGHT = 760, 200
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 28
SERIES_CLASSES = 6
"""``series-0`` ... ``series-5`` in console.css; more lines reuse them."""


@dataclass(frozen=True)
class Line:
    name: str
    points: Sequence[tuple[float, float]]
    """(Unix seconds, value), oldest first."""


@dataclass(frozen=True)
class Mark:
    """A vertical marker: a decision at ``at``, linked to its page."""

    at: float
    label: str
    href: str
    kind: str = "other"
    """Its class (``mark-<kind>``): success, failure, held, other."""


@dataclass(frozen=True)
class Chart:
    title: str
    unit: Unit
    since: float
    until: float
    step_s: float
    lines: Sequence[Line] = ()
    marks: Sequence[Mark] = field(default_factory=tuple)


def _fmt(value: float, unit: Unit) -> str:
    if unit == "ratio":
        return f"{value * 100:.0f}%"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= value:
            return float(m * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def time_label(at: float, span_s: float) -> str:
    stamp = datetime.fromtimestamp(at, UTC)
    return stamp.strftime("%m-%d %H:%M" if span_s > 86400 else "%H:%M")


def segments(
    points: Sequence[tuple[float, float]], step_s: float
) -> list[list[tuple[float, float]]]:
    """``points`` split where a step or more has no sample: a gap is drawn as a gap (missing
    data is not joined over)."""
    parts: list[list[tuple[float, float]]] = []
    last: float | None = None
    for at, value in points:
        if last is None or at - last > 1.5 * step_s:
            parts.append([])
        parts[-1].append((at, value))
        last = at
    return parts


def render(chart: Chart) -> Markup:
    """The chart as an ``<svg>`` element (accessible name: its title; description: each
    line's latest value)."""
    span = max(chart.until - chart.since, 1e-9)
    top = max((v for line in chart.lines for _, v in line.points), default=0.0)
    y_max = 1.0 if chart.unit == "ratio" else nice_max(top)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: float) -> float:
        return LEFT + (at - chart.since) / span * plot_w

    def y(value: float) -> float:
        return TOP + plot_h - min(max(value, 0.0), y_max) / y_max * plot_h

    title = escape(chart.title)
    desc = (
        "; ".join(
            f"{line.name}: latest {_fmt(line.points[-1][1], chart.unit)}"
            for line in chart.lines
            if line.points
        )
        or "no data in this time range"
    )
    out = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{title}</title><desc>{escape(desc)}</desc>",
    ]
    for i in range(5):  # horizontal grid and the y axis' labels
        value = y_max * i / 4
        gy = y(value)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>'
        )
        out.append(
            f'<text class="axis" x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{escape(_fmt(value, chart.unit))}</text>"
        )
    for i in range(5):  # the time axis
        at = chart.since + span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(
            f'<text class="axis" x="{x(at):.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">'
            f"{escape(time_label(at, span))}</text>"
        )
    for mark in chart.marks:
        if not chart.since <= mark.at <= chart.until:
            continue
        mx = x(mark.at)
        out.append(
            f'<a href="{escape(mark.href)}" class="mark mark-{escape(mark.kind)}">'
            f"<title>{escape(mark.label)}</title>"
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>'
            f'<rect x="{mx - 3:.1f}" y="{TOP}" width="6" height="{plot_h}"/></a>'
        )
    for i, line in enumerate(chart.lines):
        css = f"series-{i % SERIES_CLASSES}"
        for part in segments(line.points, chart.step_s):
            if len(part) == 1:
                at, value = part[0]
                out.append(f'<circle class="{css}" cx="{x(at):.1f}" cy="{y(value):.1f}" r="2"/>')
                continue
            coords = " ".join(f"{x(at):.1f},{y(value):.1f}" for at, value in part)
            out.append(f'<polyline class="line {css}" points="{coords}"/>')
    if not any(line.points for line in chart.lines):
        out.append(
            f'<text class="nodata" x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" '
            f'text-anchor="middle">no data in this time range</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))


def legend(chart: Chart) -> list[tuple[str, str]]:
    """(class, name) of each line, for the legend under the chart."""
    return [(f"series-{i % SERIES_CLASSES}", line.name) for i, line in enumerate(chart.lines)]
