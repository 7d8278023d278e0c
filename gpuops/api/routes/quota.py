"""``/api/v1/quota-requests``: developers ask for extra GPUs for a while; admins approve or deny
(``gpuops.runtime.quota`` applies and later undoes them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, status

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.schemas import ID_PATTERN, QuotaRequestIn
from gpuops.api.tokens import Permission, Principal
from gpuops.runtime.quota import QuotaError, QuotaRequest, QuotaStatus, request_doc

router = APIRouter(tags=["quota"])

Ctx = Annotated[ApiContext, Depends(api_context)]
RequestId = Annotated[str, Path(pattern=ID_PATTERN, description="Quota request id.")]
Status = Literal[
    "pending",
    "applying",
    "active",
    "dry_run",
    "releasing",
    "ended",
    "denied",
    "expired",
    "failed",
]


@router.post("/quota-requests", status_code=status.HTTP_201_CREATED)
def submit_quota_request(
    body: QuotaRequestIn,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.QUOTA_REQUEST))],
) -> Any:
    """Ask for ``gpus`` more GPUs for ``project`` for ``duration``; an admin approves it."""
    assert isinstance(body.duration, float)
    try:
        request = ctx.quota.submit(
            body.project, body.gpus, body.duration, body.reason, principal.name
        )
    except QuotaError as exc:
        raise HTTPException(422, str(exc)) from None
    return request_doc(request)


@router.get("/quota-requests")
def list_quota_requests(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.QUOTA_READ))],
    status: Status | None = None,
) -> Any:
    """Quota requests, newest first."""
    found = ctx.quota.requests(None if status is None else QuotaStatus(status))
    return {"requests": [request_doc(r) for r in found]}


@router.get("/quota-requests/{request_id}")
def show_quota_request(
    request_id: RequestId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.QUOTA_READ))],
) -> Any:
    """One quota request."""
    try:
        return request_doc(ctx.quota.get(request_id))
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None


def _settle(ctx: ApiContext, request_id: str, user: str, approve: bool) -> QuotaRequest:
    try:
        return (ctx.quota.approve if approve else ctx.quota.deny)(request_id, user)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except QuotaError as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/quota-requests/{request_id}/approve")
def approve_quota_request(
    request_id: RequestId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.QUOTA_DECIDE))],
) -> Any:
    """Approve and apply a pending request (its executor's grant verb runs now; while the
    engine runs in dry-run nothing runs and the request is ``dry_run``)."""
    request = _settle(ctx, request_id, principal.name, approve=True)
    return request_doc(request)


@router.post("/quota-requests/{request_id}/deny")
def deny_quota_request(
    request_id: RequestId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.QUOTA_DECIDE))],
) -> Any:
    """Refuse a pending request."""
    return request_doc(_settle(ctx, request_id, principal.name, approve=False))
