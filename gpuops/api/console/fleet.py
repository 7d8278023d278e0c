"""The console's Fleet page (``/fleet``: nodes, GPUs, the queue and what gpuops holds on each,
now) and Timeline (``/timeline``: decisions and outcomes over time with utilization and queue
charts). Both read through the API's route functions (``gpuops.api.routes.fleet``), need the
same permission and are audited under the same name; both can reload themselves every few
seconds (a ``<meta http-equiv="refresh">``: the console runs no script).
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from gpuops.api.console import charts
from gpuops.api.console.web import (
    REFRESH,
    AuditedRoute,
    ConsoleDep,
    Refused,
    ViewerDep,
    grafana_link,
    need,
    refresh_every,
    render,
)
from gpuops.api.responses.fleet import EventOut, NodeState, SeriesOut, TimelineOut
from gpuops.api.routes.fleet import show_fleet, show_timeline
from gpuops.api.schemas import NAME_PATTERN
from gpuops.api.tokens import Permission

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)

SHOW = {"all": "every node", "attention": "nodes that need attention"}
"""The Fleet page's node filter: every node, or those not up, not healthy or held by gpuops."""
RANGES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
"""The timeline's time ranges."""
KIND_OF_STATE = {
    "done": "success",
    "undone": "success",
    "failed": "failure",
    "held": "held",
    "waiting for approval": "held",
    "denied": "held",
    "expired": "held",
    "cancelled": "held",
    "dry run": "dryrun",
}
"""The class of a decision's marker on the charts (``mark-<kind>``) by its state; any other
state (running, no effect, recorded) is ``other``."""
DRAWN_LAST = ("other", "dryrun", "held", "success", "failure")
"""Markers at the same time overlap: failures are drawn over the rest, then what was done."""
STATES: tuple[NodeState, ...] = (
    "up",
    "booting",
    "draining",
    "drained",
    "powered_down",
    "down",
    "unknown",
)

Text = Annotated[str, Query(max_length=200)]


def _pool(value: str) -> str | None:
    if value and not re.fullmatch(NAME_PATTERN, value):
        raise Refused(
            422, f"pool: {value!r} is not a pool name (a letter, then letters, digits, _.-)"
        )
    return value or None


@router.get("/fleet", name="show_fleet", response_class=HTMLResponse)
def fleet_page(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    pool: Text = "",
    show: Annotated[str, Query(max_length=20)] = "all",
    refresh: int = 0,
) -> Response:
    need(viewer, Permission.ENGINE_READ, "The fleet page")
    seconds = refresh_every(refresh)
    if show not in SHOW:
        raise Refused(422, f"show: {show!r} is not one of {', '.join(SHOW)}")
    found = show_fleet(c.context, viewer.principal, _pool(pool))
    states = Counter(n.state for n in found.nodes)
    gpus = [g for n in found.nodes for g in n.gpus]
    return render(
        request,
        "fleet.html",
        viewer,
        fleet=found,
        states=[(s, states[s]) for s in STATES if states[s]],
        gpus=len(gpus),
        busy=sum(1 for g in gpus if g.job),
        held=sum(len(n.holds) + sum(len(g.holds) for g in n.gpus) for n in found.nodes),
        refresh=seconds,
        refreshes=REFRESH,
        pool=pool,
        show=show,
        shows=SHOW,
        shown=[n for n in found.nodes if show == "all" or n.attention],
        grafana={n.name: grafana_link(c.settings, {"node": n.name}) for n in found.nodes},
    )


def _until(value: str, now: float) -> float:
    if not value:
        return now
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise Refused(
            422, f"To: {value!r} is not a date and time (YYYY-MM-DDTHH:MM, UTC)"
        ) from None


def _kind(e: EventOut) -> str:
    """The class of an event's marker, by where it stands."""
    return KIND_OF_STATE.get(e.state, "other")


def _lines(series: list[SeriesOut]) -> list[charts.Line]:
    return [charts.Line(s.name, [(p.at, float(p.value)) for p in s.points]) for s in series]


def _charts(t: TimelineOut) -> list[charts.Chart]:
    marks = [
        charts.Mark(
            e.at,
            f"{e.policy} {e.transition} on {e.target}: {e.state}"
            + (f": {e.effect}" if e.effect else ""),
            f"/decisions/{e.id}",
            _kind(e),
        )
        for e in sorted(t.events, key=lambda e: DRAWN_LAST.index(_kind(e)))
    ]
    span = (t.since, t.until, t.step_s)
    return [
        charts.Chart("Mean GPU utilization by pool", "ratio", *span, _lines(t.utilization), marks),
        charts.Chart("Waiting jobs by pool", "count", *span, _lines(t.queue), marks),
    ]


@router.get("/timeline", name="show_timeline", response_class=HTMLResponse)
def timeline_page(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    range: Annotated[str, Query(max_length=10)] = "1h",  # noqa: A002 - the form's field
    until: Annotated[str, Query(max_length=40)] = "",
    pool: Text = "",
    refresh: int = 0,
) -> Response:
    need(viewer, Permission.DECISIONS_READ, "The timeline")
    seconds = refresh_every(refresh)
    if range not in RANGES:
        raise Refused(422, f"range: {range!r} is not one of {', '.join(RANGES)}")
    end = _until(until, c.context.engine.clock())
    found = show_timeline(
        c.context, viewer.principal, since=end - RANGES[range], until=end, pool=_pool(pool)
    )
    return render(
        request,
        "timeline.html",
        viewer,
        t=found,
        charts=[(ch, charts.render(ch), charts.legend(ch)) for ch in _charts(found)],
        outcomes=Counter(e.state for e in found.events),
        range=range,
        ranges=list(RANGES),
        until=until,
        pool=pool,
        refresh=seconds,
        refreshes=REFRESH,
    )
