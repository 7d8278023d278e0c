"""The console's batch operations: the list (``/batch``: each operation's state, waves, nodes
by state, failed nodes and why, who started it), one operation (``/batch/{id}``: each node's
state and step, its decisions linked to the decision page) and the forms that approve, cancel
an operation, resume a paused one or retry a failed node.

Each reads or acts through the API route's function (``gpuops.api.routes.batch``) with that
route's permission, and is audited under its name (``AuditedRoute``). Every state is said in
words: ``n7 failed at step: exit status 2; left drained``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Form, Path, Request
from fastapi.responses import HTMLResponse, Response

from gpuops.api.console.web import (
    REFRESH,
    AuditedRoute,
    Console,
    ConsoleDep,
    Refused,
    ViewerDep,
    check_csrf,
    need,
    refresh_every,
    render,
)
from gpuops.api.responses.batch import BatchNodeOut, BatchOut
from gpuops.api.routes.batch import (
    approve_batch,
    cancel_batch,
    get_batch,
    list_batches,
    resume_batch,
    retry_batch_node,
)
from gpuops.api.tokens import Permission
from gpuops.model.batch.operation import Operation, Phase
from gpuops.model.batch.opfile import parse_operation
from gpuops.model.rules.model import RulesError
from gpuops.model.telling import outcome_words, plural

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)

BATCH_ID = r"^[A-Za-z0-9_.-]{1,80}$"
"""An operation's id: its name (letters, digits, ``.``, ``_``, ``-``) and a short digest."""
NODE = r"^[A-Za-z0-9_.-]{1,200}$"

Id = Annotated[str, Path(pattern=BATCH_ID)]
Csrf = Annotated[str, Form(max_length=128)]

NODE_STATES = ("done", "running", "pending", "failed", "skipped", "cancelled")
"""The order node counts are told in: as a node goes through the operation."""
STATUS_WORDS = {
    "awaiting_approval": "waits for an approval",
    "running": "running",
    "paused": "paused",
    "done": "done",
    "cancelled": "cancelled",
}
OUT_OF_SERVICE = {"slurm": "drained", "fleet": "drained", "kubernetes": "cordoned"}
"""How a node a failed step leaves quarantined is said, by the executor that quarantined it."""


@dataclass(frozen=True)
class Told:
    """One operation as the pages tell it."""

    op: BatchOut
    operation: Operation | None
    """Its file as stored (None: it no longer reads; the page says what it can)."""
    held_as: str
    """How a node it quarantined is out of service: ``drained``, ``cordoned``."""
    counts: list[tuple[str, int]]
    failed: list[BatchNodeOut]

    @property
    def state(self) -> str:
        """``paused (failure threshold 2 reached: n2, n7 failed)``, ``waits for an
        approval``: its status and why, each said once."""
        status = STATUS_WORDS.get(self.op.status, self.op.status)
        said = self.op.why and self.op.why not in (status, "cancelled")
        return f"{status} ({self.op.why})" if said else status

    @property
    def summary(self) -> str:
        """``running (approved by alice), 3 waves so far: 12 done, 2 failed, 34 pending``;
        ``done in 16 waves: 47 done, 1 failed``."""
        counts = ", ".join(f"{n} {s}" for s, n in self.counts) or "no node"
        ended = self.op.status in ("done", "cancelled")
        state = STATUS_WORDS.get(self.op.status, self.op.status) if ended else self.state
        waves = plural(self.op.waves, "wave")
        told = f" in {waves}" if ended else f", {waves} so far"
        return f"{state}{told}: {counts}"

    @property
    def mode(self) -> str:
        if self.operation is None:
            return "its file no longer reads"
        if not self.operation.enforce:
            return "dry-run: each step is audited as what it would do, nothing runs"
        return "enforced: its steps run"

    @property
    def cancellable(self) -> bool:
        return self.op.status not in ("cancelled", "done") or bool(self.failed)

    def step_of(self, node: BatchNodeOut) -> str:
        """Where a node in the middle of its procedure is: its next step."""
        if self.operation is None:  # its file no longer reads: what it finished last
            return f"step after its {node.done[-1]}" if node.done else "first step"
        left = [p for p in self.operation.phases(node.was_out) if p.value not in node.done]
        return left[0].value if left else Phase.RETURN.value

    def words(self, node: BatchNodeOut) -> str:
        """One node in a sentence."""
        name, wave = node.name, f"wave {node.wave}"
        before = "; out of service before the operation, it stays so" if node.was_out else ""
        if node.status == "failed":
            held = "left in service" if self.held_as == "in service" else f"left {self.held_as}"
            return f"{name} failed at {node.error or 'a step'}; {held}{before}"
        if node.status == "running":
            done = f" (done: {', '.join(node.done)})" if node.done else ""
            return f"{name} is in {wave}, at its {self.step_of(node)}{done}{before}"
        if node.status == "pending":
            return f"{name} waits for its wave{before}"
        if node.status == "done":
            steps = ", ".join(node.done) or "nothing to do"
            return f"{name} done in {wave}: {steps}{before}"
        if node.status == "skipped":
            return f"{name} skipped: {node.error or 'no reason given'}"
        if node.status == "cancelled":
            return f"{name} cancelled" + (f": {node.error}" if node.error else "") + before
        return f"{name} is {node.status}{before}"


def _tell(c: Console, op: BatchOut) -> Told:
    operation: Operation | None
    try:
        rec = c.context.engine.batches.record(op.id)
        operation = parse_operation(rec.text, rec.file)  # paths not checked: only read here
    except RulesError:
        operation = None
    counts = Counter(n.status for n in op.nodes)
    return Told(
        op=op,
        operation=operation,
        held_as=_held_as(c, operation),
        counts=[(s, counts[s]) for s in NODE_STATES if counts[s]],
        failed=[n for n in op.nodes if n.status == "failed"],
    )


def _held_as(c: Console, operation: Operation | None) -> str:
    if operation is None:
        return "out of service"
    name = operation.quarantine
    if name == "none":
        return "in service"
    if name == "scheduler":
        name = str(c.context.engine.config.executors.get("scheduler", {}).get("use", "fleet"))
    return OUT_OF_SERVICE.get(name, "out of service")


@router.get("/batch", name="list_batches", response_class=HTMLResponse)
def batches_page(request: Request, c: ConsoleDep, viewer: ViewerDep, refresh: int = 0) -> Response:
    need(viewer, Permission.ENGINE_READ, "The batch operations page")
    seconds = refresh_every(refresh)
    found = list_batches(c.context, viewer.principal)
    return render(
        request,
        "batches.html",
        viewer,
        operations=[_tell(c, op) for op in reversed(found)],  # newest first
        refresh=seconds,
        refreshes=REFRESH,
    )


@router.get("/batch/{batch_id}", name="get_batch", response_class=HTMLResponse)
def batch_page(
    request: Request, c: ConsoleDep, viewer: ViewerDep, batch_id: Id, refresh: int = 0
) -> Response:
    need(viewer, Permission.ENGINE_READ, "A batch operation")
    seconds = refresh_every(refresh)
    told = _tell(c, get_batch(batch_id, c.context, viewer.principal))
    decisions: dict[str, list[dict[str, Any]]] = {}
    approval = None
    for row in reversed(c.context.engine.store.decisions(f"batch/{batch_id}", None, 10_000)):
        d = row.decision
        node = d.target.labels.get("node")
        if node is None:
            approval = d
            continue
        verb = d.action.type if d.action else None
        decisions.setdefault(node, []).append(
            {
                "id": d.id,
                "step": d.evidence.expr.rpartition(": ")[2],
                "attempt": d.repeat,
                "state": outcome_words(row.outcome, verb)
                if row.outcome
                else f"{row.status.value}, {str(d.verdict).replace('_', ' ')}",
            }
        )
    return render(
        request,
        "batch.html",
        viewer,
        t=told,
        decisions=decisions,
        approval=approval,
        can_control=viewer.can(Permission.ENGINE_CONTROL),
        can_approve=viewer.can(Permission.APPROVALS_DECIDE),
        refresh=seconds,
        refreshes=REFRESH,
    )


def _done(request: Request, viewer: ViewerDep, title: str, text: str, batch_id: str) -> Response:
    return render(
        request, "message.html", viewer, title=title, text=text, back=f"/batch/{batch_id}"
    )


@router.post("/batch/{batch_id}/approve", name="approve_batch", response_class=HTMLResponse)
def approve(
    request: Request, c: ConsoleDep, viewer: ViewerDep, batch_id: Id, csrf: Csrf = ""
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.APPROVALS_DECIDE, "Approving a batch operation")
    op = approve_batch(batch_id, c.context, viewer.principal)
    text = f"Batch operation {op.id} {op.why}: the engine runs it, its canary first."
    return _done(request, viewer, "Batch operation approved", text, op.id)


@router.post("/batch/{batch_id}/resume", name="resume_batch", response_class=HTMLResponse)
def resume(
    request: Request, c: ConsoleDep, viewer: ViewerDep, batch_id: Id, csrf: Csrf = ""
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.ENGINE_CONTROL, "Resuming a batch operation")
    op = resume_batch(batch_id, c.context, viewer.principal)
    failed = sum(1 for n in op.nodes if n.status == "failed")
    past = f", past the {plural(failed, 'node')} failed so far" if failed else ""
    text = (
        f"Batch operation {op.id} is {STATUS_WORDS.get(op.status, op.status)}: the engine goes"
        f" on from where it stopped{past}, never a finished step again."
    )
    return _done(request, viewer, "Batch operation resumed", text, op.id)


@router.post("/batch/{batch_id}/cancel", name="cancel_batch", response_class=HTMLResponse)
def cancel(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    batch_id: Id,
    csrf: Csrf = "",
    confirm: Annotated[str, Form(max_length=8)] = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.ENGINE_CONTROL, "Cancelling a batch operation")
    if confirm != "yes":
        raise Refused(422, "The operation was not cancelled: tick the box to confirm it")
    op = cancel_batch(batch_id, c.context, viewer.principal)
    told = _tell(c, op)
    said = [told.words(n) for n in op.nodes if n.status == "cancelled" and n.error]
    text = f"Batch operation {op.id} is cancelled: no node starts again." + (
        f" {'; '.join(said)}." if said else ""
    )
    return _done(request, viewer, "Batch operation cancelled", text, op.id)


@router.post("/batch/{batch_id}/retry/{node}", name="retry_batch_node", response_class=HTMLResponse)
def retry(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    batch_id: Id,
    node: Annotated[str, Path(pattern=NODE)],
    csrf: Csrf = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.ENGINE_CONTROL, "Retrying a failed node")
    op = retry_batch_node(batch_id, node, c.context, viewer.principal)
    text = (
        f"{node} is back in the queue of {op.id}, its procedure from the start; the operation"
        f" is {STATUS_WORDS.get(op.status, op.status)}: resume it to run the node."
    )
    return _done(request, viewer, "Node queued again", text, op.id)
