"""``/api/v1/quota-requests``: developers ask for extra GPUs for a while; admins approve or deny
(``gpuops.runtime.quota`` applies and later undoes them). ``/api/v1/quota-projects``: each
project's quota and the GPUs its jobs hold (``api.quota.usage_query`` on Prometheus)."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, status

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.quota import (
    ProjectQuotaOut,
    ProjectsOut,
    QuotaRequestOut,
    QuotaRequestsOut,
)
from gpuops.api.schemas import ID_PATTERN, STANDBY, QuotaRequestIn, refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.runtime.quota import QuotaError, QuotaRequest, QuotaStatus
from gpuops.sources.errors import PrometheusError

log = logging.getLogger(__name__)

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


_UNKNOWN = refusal(404, "No such quota request.")
_NOT_PENDING = refusal(409, "The request is not pending, or its grant cannot run.")


@router.post("/quota-requests", status_code=status.HTTP_201_CREATED, responses=STANDBY)
def submit_quota_request(
    body: QuotaRequestIn,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.QUOTA_REQUEST))],
) -> QuotaRequestOut:
    """Ask for ``gpus`` more GPUs for ``project`` for ``duration``; an admin approves it."""
    assert isinstance(body.duration, float)
    try:
        request = ctx.quota.submit(
            body.project, body.gpus, body.duration, body.reason, principal.name
        )
    except QuotaError as exc:
        raise HTTPException(422, str(exc)) from None
    return QuotaRequestOut.of(request)


@router.get("/quota-requests")
def list_quota_requests(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.QUOTA_READ))],
    status: Status | None = None,
) -> QuotaRequestsOut:
    """Quota requests, newest first."""
    found = ctx.quota.requests(None if status is None else QuotaStatus(status))
    return QuotaRequestsOut(requests=[QuotaRequestOut.of(r) for r in found])


@router.get("/quota-projects")
def list_quota_projects(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.QUOTA_READ))],
) -> ProjectsOut:
    """Every project configured (``api.quota.projects``) or named by a request: its base
    quota, the GPUs its active grants add, their sum, the GPUs its jobs hold now
    (``api.quota.usage_query``) and its pending requests."""
    query = ctx.quota.settings.usage_query
    usage: dict[str, float] | None = None
    error: str | None = None
    if query:
        try:
            samples = ctx.engine.prometheus.query(query)
        except PrometheusError as exc:
            error = f"usage not known: {exc}"
            log.warning("quota usage: %s", exc)
        else:
            usage = {}
            for sample in samples:
                project = sample.labels.get("project", "")
                if project:
                    usage[project] = usage.get(project, 0.0) + sample.value
    projects = ctx.quota.projects(usage)
    return ProjectsOut(projects=[ProjectQuotaOut.of(p) for p in projects], usage_error=error)


@router.get("/quota-requests/{request_id}", responses=_UNKNOWN)
def show_quota_request(
    request_id: RequestId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.QUOTA_READ))],
) -> QuotaRequestOut:
    """One quota request."""
    try:
        return QuotaRequestOut.of(ctx.quota.get(request_id))
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None


def _settle(ctx: ApiContext, request_id: str, user: str, approve: bool) -> QuotaRequest:
    try:
        return (ctx.quota.approve if approve else ctx.quota.deny)(request_id, user)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except QuotaError as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/quota-requests/{request_id}/approve", responses=_UNKNOWN | _NOT_PENDING | STANDBY)
def approve_quota_request(
    request_id: RequestId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.QUOTA_DECIDE))],
) -> QuotaRequestOut:
    """Approve and apply a pending request (its executor's grant verb runs now; while the
    engine runs in dry-run nothing runs and the request is ``dry_run``)."""
    request = _settle(ctx, request_id, principal.name, approve=True)
    return QuotaRequestOut.of(request)


@router.post("/quota-requests/{request_id}/deny", responses=_UNKNOWN | _NOT_PENDING | STANDBY)
def deny_quota_request(
    request_id: RequestId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.QUOTA_DECIDE))],
) -> QuotaRequestOut:
    """Refuse a pending request."""
    return QuotaRequestOut.of(_settle(ctx, request_id, principal.name, approve=False))
