"""``/api/v1/batch``: batch operations as the engine's state holds them (``gpuops.runtime.batch``)
— list, one with its nodes — and what the engine does with them (``gpuops.runtime.rollouts``):
start one from an operation file's content, resume, approve, cancel, retry of a failed node.
The engine's leader runs them, over the fleet its configuration names (``batch``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.batch import BatchNodeOut, BatchOut, BatchRefusedOut
from gpuops.api.schemas import STANDBY, InvalidRequestOut, refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.model.batch.plan import PlanError
from gpuops.model.rules.model import RulesError
from gpuops.runtime.batch import BatchError

router = APIRouter()

Ctx = Annotated[ApiContext, Depends(api_context)]
Read = Annotated[Principal, Depends(require(Permission.ENGINE_READ))]
Control = Annotated[Principal, Depends(require(Permission.ENGINE_CONTROL))]
_UNKNOWN = refusal(404, "No such batch operation.")
_CHANGED = (
    _UNKNOWN
    | refusal(409, "Nothing to resume, cancel or approve, or the node did not fail.")
    | STANDBY
)
_STARTED = (
    refusal(409, "The engine has no fleet for batch operations (its configuration's batch).")
    | refusal(
        422,
        "The operation cannot run (each problem names its field), or the body is not one.",
        BatchRefusedOut | InvalidRequestOut,
    )
    | STANDBY
)


class BatchStartIn(BaseModel):
    """An operation to start: its file's content, as ``gpuops batch plan`` reads it."""

    model_config = ConfigDict(extra="forbid")

    operation: str = Field(max_length=256 * 1024, description="The operation file's YAML.")
    file: str = Field(
        default="operation.yaml",
        max_length=4096,
        description="Its name, in the problems' FILE:LINE.",
    )
    folder: str | None = Field(
        default=None,
        max_length=4096,
        description="Where its paths (playbook, inventory) are, on the engine's host (an"
        " absolute path); default: the configuration's batch.folder.",
    )


def _out(ctx: ApiContext, batch_id: str) -> BatchOut:
    runner = ctx.engine.batches
    try:
        rec = runner.record(batch_id)
    except BatchError as exc:
        raise HTTPException(404, str(exc)) from None
    nodes = runner.nodes(batch_id)
    return BatchOut(
        id=rec.id,
        status=rec.status,
        started_by=rec.started_by,
        why=rec.why,
        waves=rec.waves,
        created_at=rec.created_at,
        timeline=[[float(v) for v in row] for row in rec.timeline],
        nodes=[
            BatchNodeOut(
                name=name,
                status=nodes[name].status,
                wave=nodes[name].wave,
                done=nodes[name].done,
                error=nodes[name].error,
                was_out=nodes[name].was_out,
            )
            for name in rec.order
            if name in nodes
        ],
    )


@router.get("/batch", tags=["batch"])
def list_batches(ctx: Ctx, _: Read) -> list[BatchOut]:
    """Every batch operation, oldest first, with its nodes."""
    return [_out(ctx, stored.id) for stored in ctx.engine.store.batches()]


@router.post("/batch", tags=["batch"], status_code=201, response_model=BatchOut, responses=_STARTED)
def start_batch(body: BatchStartIn, ctx: Ctx, principal: Control) -> BatchOut | JSONResponse:
    """Start an operation: refused (422, each problem naming its field) as ``gpuops batch
    plan`` refuses it; else stored with its nodes pending and run by the engine's leader, wave
    after wave, every step through the gate (dry-run unless it says ``enforce: true``)."""
    ctx.engine.leadership.require()
    try:
        batch_id = ctx.engine.rollouts.start(
            body.operation, body.file, body.folder, by=principal.name
        )
    except RulesError as exc:
        return _refused([str(e) for e in exc.errors])
    except PlanError as exc:
        return _refused([f"{body.file}: {p}" for p in exc.problems])
    except BatchError as exc:
        raise HTTPException(409, str(exc)) from None
    return _out(ctx, batch_id)


def _refused(problems: list[str]) -> JSONResponse:
    count = len(problems)
    refused = BatchRefusedOut(
        detail=f"{count} problem{'s' if count != 1 else ''}: nothing runs", errors=problems
    )
    return JSONResponse(refused.model_dump(mode="json"), status_code=422)


def _changed(ctx: ApiContext, batch_id: str, change: Callable[..., object], *args: str) -> BatchOut:
    """``change(batch_id, *args)`` on the leader: 404 for an unknown operation, 409 for a
    change its state does not allow; the operation as it is after it."""
    ctx.engine.leadership.require()
    _out(ctx, batch_id)  # 404 when unknown
    try:
        change(batch_id, *args)
    except BatchError as exc:
        raise HTTPException(409, str(exc)) from None
    return _out(ctx, batch_id)


@router.post("/batch/{batch_id}/resume", tags=["batch"], responses=_CHANGED)
def resume_batch(batch_id: str, ctx: Ctx, _: Control) -> BatchOut:
    """Let a paused operation go on (past the nodes failed so far): the engine's leader runs
    it from where it stopped, never a finished step again."""
    return _changed(ctx, batch_id, ctx.engine.rollouts.resume)


@router.get("/batch/{batch_id}", tags=["batch"], responses=_UNKNOWN)
def get_batch(batch_id: str, ctx: Ctx, _: Read) -> BatchOut:
    """One batch operation and where each of its nodes is."""
    return _out(ctx, batch_id)


@router.post("/batch/{batch_id}/cancel", tags=["batch"], responses=_CHANGED)
def cancel_batch(batch_id: str, ctx: Ctx, _: Control) -> BatchOut:
    """No node starts again; nodes in the middle of their procedure are returned to service
    (through the gate), failed ones let go still out of service. An operation the engine is
    running stops between two steps first (a running step finishes, or is cancelled with
    ``on_stop: cancel``); the answer may still say ``running`` until it has."""
    return _changed(ctx, batch_id, ctx.engine.rollouts.cancel)


@router.post("/batch/{batch_id}/approve", tags=["batch"], responses=_CHANGED)
def approve_batch(
    batch_id: str,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> BatchOut:
    """Let an operation that says ``approval: true`` run (audited with the approver): the
    engine's leader runs it."""
    return _changed(ctx, batch_id, ctx.engine.rollouts.approve, principal.name)


@router.post("/batch/{batch_id}/retry/{node}", tags=["batch"], responses=_CHANGED)
def retry_batch_node(batch_id: str, node: str, ctx: Ctx, _: Control) -> BatchOut:
    """Put a failed node back in the operation's queue (``resume`` runs it)."""
    return _changed(ctx, batch_id, ctx.engine.batches.retry, node)
