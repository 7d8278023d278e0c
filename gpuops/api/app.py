"""``create_app(engine, settings)``: the engine's REST API as a FastAPI app.

Routes live under ``/api/v1`` (one module per resource in ``gpuops.api.routes``), behind
``gpuops.api.middleware`` (size limit, authentication, audit of every call: a document, or a
successful read counted) and the permission
checks of ``gpuops.api.auth``. ``/healthz`` and ``/metrics`` are open and not audited. No global
app: ``gpuops engine run`` (through ``gpuops.api.server``) and the tests each build their own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuops import __version__
from gpuops.api.console import mount_console
from gpuops.api.context import ApiContext
from gpuops.api.docs import mount_docs
from gpuops.api.middleware import ApiMiddleware
from gpuops.api.responses.engine import HealthOut, LeadershipOut, LeaseOut
from gpuops.api.routes import (
    alertmanager,
    audit,
    batch,
    control,
    decisions,
    fleet,
    health,
    quota,
    rules,
)
from gpuops.api.schemas import InvalidRequestOut, ProblemOut, Responses, refusal
from gpuops.api.tokens import TokenStore
from gpuops.runtime import Engine
from gpuops.runtime.leadership import NotLeaderError
from gpuops.settings import ApiSettings
from gpuops.store.errors import StateError

log = logging.getLogger(__name__)

PREFIX = "/api/v1"


def create_app(
    engine: Engine,
    settings: ApiSettings,
    *,
    environ: Mapping[str, str] | None = None,
) -> FastAPI:
    """The API of ``engine``. Users are loaded now (``TokensError`` when they cannot be). The
    app owns no thread: the alert inbox and the quota ticker are the engine's."""
    tokens = TokenStore(settings.tokens_file, settings.tokens_env, environ)
    tokens.reload()
    registry = CollectorRegistry()
    context = ApiContext(
        engine=engine,
        settings=settings,
        tokens=tokens,
        registry=registry,
    )

    app = FastAPI(
        title="gpuops engine API",
        version=__version__,
        description="Rules, decisions, approvals, quota requests and controls of a gpuops "
        "engine. Every call needs a bearer token; see docs/api.md for roles.",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=None,  # gpuops.api.docs serves it with local assets
        redoc_url=None,
    )
    app.state.api = context
    errors: Responses = (
        refusal(401, "No or an invalid token.")
        | refusal(403, "The user's roles lack the permission.")
        | refusal(413, "The body is too large.")
        | refusal(422, "The request does not validate.", InvalidRequestOut)
    )
    for module in (rules, decisions, quota, control, alertmanager, health, audit, fleet, batch):
        app.include_router(module.router, prefix=PREFIX, responses=errors)
    mount_docs(app, f"{PREFIX}/openapi.json", f"{PREFIX}/docs", f"{PREFIX}/redoc")
    if settings.console.enabled:
        mount_console(app, context)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(NotLeaderError, _not_leader)
    app.add_middleware(
        ApiMiddleware,
        tokens=tokens,
        record=engine.audit.operation,
        count_read=engine.audit.read,
        max_body_bytes=settings.max_body_bytes,
        body_limits={f"{PREFIX}/alertmanager": settings.alertmanager_max_body_bytes},
        prefix=PREFIX,
        open_paths=frozenset({f"{PREFIX}/openapi.json", f"{PREFIX}/docs", f"{PREFIX}/redoc"}),
    )

    @app.get("/healthz", tags=["meta"], responses={503: {"model": HealthOut}})
    def healthz(response: Response) -> HealthOut:
        """Health: the process answers, its state file can be read, and its audit spool takes
        intents (503 with the reason when it does not: then no action runs). ``degraded`` (200)
        names the policies whose stored state cannot be read (not evaluated; docs/state.md)."""
        problem = engine.problem()
        degraded = engine.degraded()
        paused: bool | None = None
        kill_switch: bool | None = None
        try:
            paused, kill_switch = engine.paused(), engine.kill_switch_on()
        except StateError as exc:  # the state database cannot be reached (docs/ha.md)
            problem = problem or f"the state cannot be read: {exc}"
        if problem is not None:
            response.status_code = 503
        return HealthOut(
            status="unhealthy" if problem is not None else "degraded" if degraded else "ok",
            paused=paused,
            kill_switch=kill_switch,
            reason=problem,
            degraded=degraded or None,
            leadership=_leadership(engine),
        )

    @app.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """The engine's, the audit's and the API's Prometheus metrics."""
        registries = (engine.metrics.registry, engine.audit.registry, registry)
        unique = {id(r): r for r in registries}.values()  # the audit may share the engine's
        body = b"".join(generate_latest(r) for r in unique)
        return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)

    return app


def _leadership(engine: Engine) -> LeadershipOut:
    """``/healthz``'s leadership block: this replica's role, and the lease as last read."""
    role: Literal["leader", "standby"] = "leader" if engine.leading() else "standby"
    info = engine.leadership.leader()
    if info is None:
        return LeadershipOut(role=role, replica=engine.replica)
    return LeaseOut(
        role=role,
        replica=engine.replica,
        leader=info.holder if info.expires_in > 0 else None,
        epoch=info.epoch,
        leader_url=info.url,
    )


async def _not_leader(request: Request, exc: Exception) -> JSONResponse:
    """A write sent to a standby: 503 naming the leader (``X-Gpuops-Leader``: its API URL, when
    it advertises one), so that a client or load balancer sends it there (docs/ha.md)."""
    assert isinstance(exc, NotLeaderError)
    _remember(request, str(exc))
    headers = {}
    if exc.leader is not None and exc.leader.link and exc.leader.expires_in > 0:
        headers["X-Gpuops-Leader"] = exc.leader.link
    return JSONResponse({"detail": str(exc)}, 503, headers=headers)


def _remember(request: Request, reason: str) -> None:
    request.state.gpuops_reason = reason


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    _remember(request, detail)
    return JSONResponse({"detail": detail}, exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 with every problem as ``where: what`` (inputs are not echoed back)."""
    assert isinstance(exc, RequestValidationError)
    problems = [
        ProblemOut(loc=[str(p) for p in err.get("loc", ())], msg=str(err.get("msg", "")))
        for err in exc.errors()
    ]
    reason = "; ".join(f"{'.'.join(p.loc)}: {p.msg}" for p in problems) or "invalid request"
    _remember(request, reason)
    answer = InvalidRequestOut(detail=reason, errors=problems)
    return JSONResponse(answer.model_dump(mode="json"), 422)
