"""The console's GPU health page (``/health``): the nodes on the remediation ladder by stage —
needing a human first, then quarantined, remediating, validating, returned — each with its
fault, its time in the stage, the steps done, why it is there and the quarantine decision that
put it there (linked to the decision page); and the form an operator with ``engine:control``
uses to clear a node that needed a human.

It reads and acts through the API route's functions (``gpuops.api.routes.health``) with their
permissions, audited under their names (``AuditedRoute``). Every row is said in words:
``n7 needs a human: a second remediation within 7 days; it stays drained``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Form, Path, Request
from fastapi.responses import HTMLResponse, Response

from gpuops.api.console.web import (
    REFRESH,
    AuditedRoute,
    ConsoleDep,
    ViewerDep,
    check_csrf,
    need,
    refresh_every,
    render,
)
from gpuops.api.routes.health import RepairOut, clear_health_node, health_nodes
from gpuops.api.tokens import Permission
from gpuops.model.readiness import duration
from gpuops.model.telling import plural

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)

NODE = r"^[A-Za-z0-9_.:-]{1,200}$"
Csrf = Annotated[str, Form(max_length=128)]

STAGES = (
    ("needs_human", "Needs a human"),
    ("quarantined", "Quarantined"),
    ("remediating", "Remediating"),
    ("validating", "Validating"),
    ("returned", "Returned to service"),
    ("healthy", "Off the ladder (cleared by an admin, or taken back by someone)"),
)
"""The stages in the order the page lists them, each with its heading: what needs someone
first."""


@dataclass(frozen=True)
class Row:
    """One node as the page tells it."""

    r: RepairOut
    now: float

    @property
    def in_stage(self) -> str:
        return duration(max(0.0, self.now - self.r.since))

    @property
    def words(self) -> str:
        """The node in a sentence."""
        r = self.r
        done = f"; done: {', '.join(r.done)}" if r.done else ""
        why = f": {r.why}" if r.why else ""
        if r.stage == "needs_human":
            return f"{r.node} needs a human{why}{done}; it stays drained until an admin acts"
        if r.stage == "quarantined":
            return f"{r.node} is drained for its faulty GPU{why}; its remediation has not begun"
        if r.stage == "remediating":
            return f"{r.node} is being remediated: {r.step or 'its next step'}{done}{why}"
        if r.stage == "validating":
            return f"{r.node} is checked before it returns to service{done}"
        if r.stage == "returned":
            return f"{r.node} returned to service after {', '.join(r.done) or 'its check'}"
        return f"{r.node} is off the ladder{why}"


@router.get("/health", name="health_nodes", response_class=HTMLResponse)
def health_page(request: Request, c: ConsoleDep, viewer: ViewerDep, refresh: int = 0) -> Response:
    need(viewer, Permission.ENGINE_READ, "The GPU health page")
    seconds = refresh_every(refresh)
    now = time.time()
    rows = [Row(r, now) for r in health_nodes(c.context, viewer.principal)]
    stages = [
        (stage, title, sorted((x for x in rows if x.r.stage == stage), key=lambda x: x.r.since))
        for stage, title in STAGES
    ]
    counts = ", ".join(
        plural(len(found), "node") + f" {t.lower()}" for _, t, found in stages if found
    )
    return render(
        request,
        "health.html",
        viewer,
        stages=[s for s in stages if s[2]],
        counts=counts,
        can_clear=viewer.can(Permission.ENGINE_CONTROL),
        refresh=seconds,
        refreshes=REFRESH,
    )


@router.post("/health/{node}/clear", name="clear_health_node", response_class=HTMLResponse)
def clear(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    node: Annotated[str, Path(pattern=NODE)],
    csrf: Csrf = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.ENGINE_CONTROL, "Clearing a node that needs a human")
    cleared = clear_health_node(node, request, c.context, viewer.principal)
    text = (
        f"{cleared.node} is cleared: its next fault may be remediated again. It stays drained:"
        " return it to service yourself once it is repaired."
    )
    return render(request, "message.html", viewer, title="Node cleared", text=text, back="/health")
