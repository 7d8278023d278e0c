"""``/api/v1/engine`` (pause, resume, kill switch) and ``/api/v1/auth`` (who am I, reload the
users). Controls are persisted by the engine, so they survive a restart."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Request

from gpuops import __version__
from gpuops.api.auth import caller, require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.auth import UsersReloadedOut, WhoAmIOut
from gpuops.api.responses.engine import ControlState
from gpuops.api.schemas import STANDBY, InvalidRequestOut, refusal
from gpuops.api.tokens import Permission, Principal, TokensError

router = APIRouter()

Ctx = Annotated[ApiContext, Depends(api_context)]
Control = Annotated[Principal, Depends(require(Permission.ENGINE_CONTROL))]


def _state(ctx: ApiContext) -> ControlState:
    engine = ctx.engine
    return ControlState(
        paused=engine.paused(),
        kill_switch=engine.kill_switch_on(),
        dry_run=engine.config.guardrails.dry_run,
        policies=sum(1 for _ in engine.rules.policies()),
        version=__version__,
    )


@router.get("/engine", tags=["engine"])
def engine_status(
    ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.ENGINE_READ))]
) -> ControlState:
    """Whether the engine is paused, its kill switch is on or it runs in dry-run."""
    return _state(ctx)


@router.post("/engine/pause", tags=["engine"], responses=STANDBY)
def pause_engine(ctx: Ctx, principal: Control) -> ControlState:
    """Stop acting: decisions are still taken and audited, as suppressed."""
    ctx.engine.set_control("paused", True, principal.name)
    return _state(ctx)


@router.post("/engine/resume", tags=["engine"], responses=STANDBY)
def resume_engine(ctx: Ctx, principal: Control) -> ControlState:
    ctx.engine.set_control("paused", False, principal.name)
    return _state(ctx)


@router.post("/engine/kill-switch/{state}", tags=["engine"], responses=STANDBY)
def set_kill_switch(state: Literal["on", "off"], ctx: Ctx, principal: Control) -> ControlState:
    """No action runs while it is on (a kill-switch file, when configured, also counts)."""
    ctx.engine.set_control("kill_switch", state == "on", principal.name)
    return _state(ctx)


@router.get("/auth/whoami", tags=["auth"])
def whoami(request: Request) -> WhoAmIOut:
    """The caller's user name, roles and permissions."""
    principal = caller(request)
    if principal is None:  # the middleware authenticates every /api/v1 request first
        raise HTTPException(401, "no credentials: send 'Authorization: Bearer <token>'")
    permissions = sorted((p for p in Permission if principal.can(p)), key=lambda p: p.value)
    return WhoAmIOut(name=principal.name, roles=list(principal.roles), permissions=permissions)


@router.post(
    "/auth/reload",
    tags=["auth"],
    responses=refusal(422, "The users cannot be read; the current ones stay.", InvalidRequestOut),
)
def reload_users(
    ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.AUTH_RELOAD))]
) -> UsersReloadedOut:
    """Read the tokens file (and variable) again; on error the current users stay (422)."""
    try:
        users = ctx.tokens.reload()
    except TokensError as exc:
        raise HTTPException(422, f"users not reloaded, the current ones stay: {exc}") from None
    return UsersReloadedOut(users=users)
