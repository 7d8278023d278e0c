"""``POST /api/v1/health/events``: node agents push XIDs and lost GPUs the moment NVML reports
them.

Authenticated like the Alertmanager receiver (a bearer token whose role has
``alerts:receive``: the ``alertmanager`` role), bounded by ``api.max_body_bytes`` (413 before it
is parsed). A body that is not the documented shape is answered 400 naming the field
(``events[2].xid: ...``) and nothing of it is taken. The events go to the engine's health
inbox (``gpuops.runtime.health.HealthInbox``): counted against the XID catalogue, a faulty GPU
raised as the alert ``GpuFault`` in the alert inbox. The answer comes once that is stored; when
it cannot be, 503 with the reason, and the agent sends the events again (their ids make the
second sending harmless).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.schemas import refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.model.health.events import EventKind, HealthEvent
from gpuops.runtime.alerts import InboxFull
from gpuops.store.errors import StateError

router = APIRouter(tags=["health"])

MAX_EVENTS = 10_000
"""Events in one request (an agent sends what queued while the engine was away in batches of at
most this many)."""


NOTED = 20
"""Faults and skips named in the call's audit document (the rest are counted)."""


class EventIn(BaseModel):
    """One event as a node agent sends it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=128)
    """The agent's id of the event; the same event sent again carries the same id."""
    node: str = Field(min_length=1, max_length=256)
    """The node's name as the scheduler knows it (Slurm's node name)."""
    gpu: str = Field(min_length=1, max_length=128)
    """The GPU's UUID."""
    kind: Literal["xid", "gpu_lost"]
    xid: int | None = Field(default=None, ge=0, le=65535)
    """The XID code (``kind: xid`` only)."""
    at: float = Field(gt=0, lt=253402300800, allow_inf_nan=False)
    """When NVML reported it, Unix seconds."""
    pool: str = Field(default="", max_length=256)
    """The node's pool (Slurm: partition): its profile (``health.profiles``) applies."""

    @model_validator(mode="after")
    def _xid_with_kind(self) -> EventIn:
        if self.kind == "xid" and self.xid is None:
            raise ValueError("an xid event needs xid (the XID code)")
        if self.kind == "gpu_lost" and self.xid is not None:
            raise ValueError("a gpu_lost event has no xid")
        return self

    def value(self) -> HealthEvent:
        return HealthEvent(
            self.id, self.node, self.gpu, EventKind(self.kind), self.at, self.xid, self.pool
        )


class EventsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(max_length=MAX_EVENTS)


class EventsTaken(BaseModel):
    """What the request's events came to."""

    accepted: int
    """New events (not sent before)."""
    duplicates: int
    """Events whose id was taken before: nothing more was done."""
    faults: int
    """GPUs found faulty, each raised as a ``GpuFault`` alert."""
    skipped: int
    """Events that do not act: older than their node's return to service, or an XID the
    catalogue does not know."""


def _problem(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ""
        for part in err["loc"]:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else part)
        message = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{where or 'body'}: {message}")
    return "; ".join(problems[:10])


@router.post(
    "/health/events",
    responses=refusal(400, "The body is not a list of events; the detail names the field.")
    | refusal(503, "The engine cannot store the faults now (or is a standby): send again."),
)
def receive_health_events(
    request: Request,
    body: Annotated[Any, Body(description='`{"events": [...]}`, see EventsIn.')],
    ctx: Annotated[ApiContext, Depends(api_context)],
    _: Annotated[Principal, Depends(require(Permission.ALERTS_RECEIVE))],
) -> EventsTaken:
    """Take XID and lost-GPU events from a node agent; a GPU past its XID threshold (or lost)
    is raised as the alert ``GpuFault``, which the policies of ``rules/health`` act on."""
    try:
        events = EventsIn.model_validate(body)
    except ValidationError as exc:
        raise HTTPException(400, _problem(exc)) from None
    try:
        receipt = ctx.engine.health.submit([e.value() for e in events.events])
    except InboxFull as exc:
        raise HTTPException(503, str(exc)) from None
    except StateError as exc:
        raise HTTPException(503, f"the faults cannot be stored now: {exc}; send again") from None
    if receipt.notes:  # the call's audit document says what was raised and skipped, and why
        shown = "; ".join(receipt.notes[:NOTED])
        more = len(receipt.notes) - NOTED
        request.state.gpuops_note = shown + (f"; and {more} more" if more > 0 else "")
    return EventsTaken(
        accepted=receipt.accepted,
        duplicates=receipt.duplicates,
        faults=receipt.faults,
        skipped=receipt.skipped,
    )
