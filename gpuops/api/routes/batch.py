"""``/api/v1/batch``: batch operations as the engine's state holds them (``gpuops.runtime.batch``)
— list, one with its nodes, cancel, retry of a failed node. They are started and resumed with
``gpuops batch run|resume``, which name the fleet."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.batch import BatchNodeOut, BatchOut
from gpuops.api.schemas import STANDBY, refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.runtime.batch import BatchError

router = APIRouter()

Ctx = Annotated[ApiContext, Depends(api_context)]
Read = Annotated[Principal, Depends(require(Permission.ENGINE_READ))]
Control = Annotated[Principal, Depends(require(Permission.ENGINE_CONTROL))]
_UNKNOWN = refusal(404, "No such batch operation.")
_CHANGED = (
    _UNKNOWN | refusal(409, "Nothing to cancel or approve, or the node did not fail.") | STANDBY
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


@router.get("/batch/{batch_id}", tags=["batch"], responses=_UNKNOWN)
def get_batch(batch_id: str, ctx: Ctx, _: Read) -> BatchOut:
    """One batch operation and where each of its nodes is."""
    return _out(ctx, batch_id)


@router.post("/batch/{batch_id}/cancel", tags=["batch"], responses=_CHANGED)
def cancel_batch(batch_id: str, ctx: Ctx, _: Control) -> BatchOut:
    """No node starts again; nodes in the middle of their procedure are returned to service
    (through the gate), failed ones let go still out of service."""
    ctx.engine.leadership.require()
    try:
        ctx.engine.batches.cancel(batch_id)
    except BatchError as exc:
        raise HTTPException(409, str(exc)) from None
    return _out(ctx, batch_id)


@router.post("/batch/{batch_id}/approve", tags=["batch"], responses=_CHANGED)
def approve_batch(
    batch_id: str,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> BatchOut:
    """Let an operation that says ``approval: true`` run (audited with the approver);
    ``gpuops batch resume`` runs it."""
    ctx.engine.leadership.require()
    try:
        ctx.engine.batches.approve(batch_id, principal.name)
    except BatchError as exc:
        raise HTTPException(409, str(exc)) from None
    return _out(ctx, batch_id)


@router.post("/batch/{batch_id}/retry/{node}", tags=["batch"], responses=_CHANGED)
def retry_batch_node(batch_id: str, node: str, ctx: Ctx, _: Control) -> BatchOut:
    """Put a failed node back in the operation's queue (``gpuops batch resume`` runs it)."""
    ctx.engine.leadership.require()
    try:
        ctx.engine.batches.retry(batch_id, node)
    except BatchError as exc:
        raise HTTPException(409, str(exc)) from None
    return _out(ctx, batch_id)
