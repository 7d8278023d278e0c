"""The answers about the engine itself: its controls (``/api/v1/engine``) and its health
(``/healthz``, with this replica's leadership). Built by ``gpuops.api.routes.control`` and
``gpuops.api.app``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from gpuops.api.responses import Out, absent_when_none


class ControlState(Out):
    paused: bool
    kill_switch: bool
    dry_run: bool
    """The engine runs with ``--dry-run`` (or ``guardrails.dry_run``): it executes nothing."""
    policies: int
    version: str


class LeadershipOut(Out):
    """This replica's role (``/healthz``; docs/ha.md)."""

    role: Literal["leader", "standby"]
    replica: str


class LeaseOut(LeadershipOut):
    """This replica's role and the lease as last read (replicas sharing a Postgres state)."""

    leader: str | None = Field(description="The live lease's holder; None once it expired.")
    epoch: int
    leader_url: str | None = Field(description="The API URL the leader advertises.")


class HealthOut(Out):
    """Whether the engine can act: ``unhealthy`` (503) when it cannot (``reason`` says why),
    ``degraded`` when policies cannot be evaluated (``degraded`` names them)."""

    status: Literal["ok", "degraded", "unhealthy"]
    paused: bool | SkipJsonSchema[None] = absent_when_none()
    """Left out, like ``kill_switch``, when the state cannot be read."""
    kill_switch: bool | SkipJsonSchema[None] = absent_when_none()
    reason: str | SkipJsonSchema[None] = absent_when_none()
    degraded: dict[str, str] | SkipJsonSchema[None] = absent_when_none()
    """Policy -> why its stored state cannot be read."""
    leadership: LeaseOut | LeadershipOut
