"""``/api/v1/audit``: search the audit trail (decisions, outcomes, user operations) — what an
auditor reads. The same search as ``gpuops audit search``: Elasticsearch when the engine ships
there, else the engine's local spool."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.audit import AuditSearchOut
from gpuops.api.schemas import NAME_PATTERN, refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.audit.client import make_client
from gpuops.audit.errors import ElasticsearchError
from gpuops.audit.search import Backend, ElasticsearchBackend, SearchQuery, SpoolBackend
from gpuops.model.rules.durations import DurationError, parse_duration

router = APIRouter(tags=["audit"])

Ctx = Annotated[ApiContext, Depends(api_context)]
Reader = Annotated[Principal, Depends(require(Permission.AUDIT_READ))]


@contextmanager
def _backend(ctx: ApiContext) -> Iterator[Backend]:
    settings = ctx.engine.audit.settings
    if not settings.elasticsearch_url:
        yield SpoolBackend(settings.spool_dir)
        return
    client = make_client(settings)
    try:
        yield ElasticsearchBackend(client)
    finally:
        client.close()


@router.get("/audit", responses=refusal(503, "The audit store cannot be searched now."))
def search_audit(
    ctx: Ctx,
    _: Reader,
    since: Annotated[str, Query(description="Only the last DURATION (Prometheus syntax).")] = "24h",
    user: Annotated[str | None, Query(max_length=128)] = None,
    policy: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    outcome: Literal["success", "failure", "unknown"] | None = None,
    label: Annotated[list[str], Query(description="Target label NAME=VALUE.")] = [],  # noqa: B006
    text: Annotated[str | None, Query(max_length=256)] = None,
    stream: Literal["all", "decision", "audit"] = "all",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditSearchOut:
    """Audit documents (ECS), newest first; every criterion given must hold."""
    try:
        window = parse_duration(since)
    except DurationError as exc:
        raise HTTPException(422, f"since: {exc}") from None
    labels = {}
    for item in label:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise HTTPException(422, f"label: {item!r} is not NAME=VALUE")
        labels[name] = value
    query = SearchQuery(
        since=time.time() - window,
        user=user,
        policy=policy,
        action=action,
        outcome=outcome,
        labels=labels,
        text=text,
        stream=stream,
        limit=limit,
    )
    try:
        with _backend(ctx) as backend:
            documents = backend.search(query)
    except ElasticsearchError as exc:
        raise HTTPException(503, f"audit store unavailable: {exc}") from None
    return AuditSearchOut(documents=documents, count=len(documents))
