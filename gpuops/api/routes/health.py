"""``POST /api/v1/health/events``: node agents push XIDs and lost GPUs the moment NVML reports
them; ``GET /api/v1/health/nodes`` and ``POST /api/v1/health/nodes/{node}/clear``: the
remediation ladder's nodes, and an admin's clear of one that needs a human.

Authenticated like the Alertmanager receiver (a bearer token whose role has
``alerts:receive``: the ``alertmanager`` role), bounded by ``api.max_body_bytes`` (413 before it
is parsed). A body that is not the documented shape is answered 400 naming the field
(``events[2].xid: ...``) and nothing of it is taken; so is a node label named like one the
engine sets itself, a pool that is not a label value, and a failure domain's label
(``health.ladder.pacing.domains``: the only labels the engine keeps, data for pacing) whose
value is not one; an event from before its node's reboot (its ``boot_id`` is not the
request's) is kept by its id only and never acts. The events go to the engine's health
inbox (``gpuops.runtime.health.HealthInbox``): counted against the XID catalogue, a faulty GPU
raised as the alert ``GpuFault`` in the alert inbox. The answer comes once that is stored; when
it cannot be, 503 with the reason, and the agent sends the events again (their ids make the
second sending harmless).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.schemas import refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.model.health.events import (
    FAULT_LABELS,
    EventKind,
    HealthEvent,
    domain_value_problem,
)
from gpuops.model.health.ladder import Repair
from gpuops.runtime.alerts import InboxFull
from gpuops.store.errors import StateError

router = APIRouter(tags=["health"])

MAX_EVENTS = 10_000
"""Events in one request (an agent sends what queued while the engine was away in batches of at
most this many)."""


MAX_LABELS = 16
"""Labels of one event's node."""
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

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
    labels: dict[str, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=MAX_LABELS
    )
    """The node's labels (``{rack: r12, zone: z1}``): the failure domains of its repair
    (``health.ladder.pacing.domains``); those the pacing does not name are left out."""
    boot_id: str | None = Field(default=None, min_length=1, max_length=64)
    """The boot of the node NVML reported it in (the kernel's boot id)."""

    @model_validator(mode="after")
    def _xid_with_kind(self) -> EventIn:
        if self.kind == "xid" and self.xid is None:
            raise ValueError("an xid event needs xid (the XID code)")
        if self.kind == "gpu_lost" and self.xid is not None:
            raise ValueError("a gpu_lost event has no xid")
        return self

    @field_validator("labels", mode="after")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not LABEL_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
            if name in FAULT_LABELS:
                raise ValueError(f"{name!r} is a label of the GpuFault alert itself")
        return value

    @field_validator("pool", mode="after")
    @classmethod
    def _pool(cls, value: str) -> str:
        problem = domain_value_problem(value) if value else None
        if problem is not None:
            raise ValueError(f"the pool {problem}")
        return value

    def value(self) -> HealthEvent:
        return HealthEvent(
            self.id,
            self.node,
            self.gpu,
            EventKind(self.kind),
            self.at,
            self.xid,
            self.pool,
            tuple(sorted(self.labels.items())),
            self.boot_id or "",
        )


class EventsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(max_length=MAX_EVENTS)
    boot_id: str | None = Field(default=None, min_length=1, max_length=64)
    """The sending agent's node's boot now: its events of another boot are from before a
    reboot."""


class EventsTaken(BaseModel):
    """What the request's events came to."""

    accepted: int
    """New events (not sent before)."""
    duplicates: int
    """Events whose id was taken before: nothing more was done."""
    faults: int
    """GPUs found faulty, each raised as a ``GpuFault`` alert."""
    skipped: int
    """Events that do not act: from before their node's reboot, older than its return to
    service or than ``health.max_event_age``, or an XID the catalogue does not know."""


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
    domains = ctx.engine.health.domains
    for index, sent in enumerate(events.events):
        for name in sorted(domains & sent.labels.keys()):
            problem = domain_value_problem(sent.labels[name])
            if problem is not None:
                raise HTTPException(400, f"events[{index}].labels.{name}: the value {problem}")
    try:
        receipt = ctx.engine.health.submit([e.value() for e in events.events], events.boot_id or "")
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


class RepairOut(BaseModel):
    """One node's place on the remediation ladder (docs/health.md, "Remediation")."""

    node: str
    stage: str
    """healthy, quarantined, remediating, validating, returned or needs_human."""
    since: float
    """When it entered ``stage``, Unix seconds."""
    gpu: str
    """The faulty GPU's UUID."""
    fault: str
    """The fault's reason (``XID 48 (...) x1``)."""
    step: str
    """The remediation step due or running, or the last one."""
    done: list[str]
    """The steps done in this climb."""
    why: str
    """Why the node is where it is (a failed step, why it needs a human, who cleared it)."""
    quarantined_by: str
    """The decision id of the quarantine."""
    returned_at: float | None
    domains: list[str] = []
    """The failure domains its repair is paced in (``pool=a100``, ``rack=r12``)."""

    @staticmethod
    def of(repair: Repair, domains: Sequence[str] = ()) -> RepairOut:
        return RepairOut(
            node=repair.node,
            stage=repair.stage.value,
            since=repair.since,
            gpu=repair.gpu,
            fault=repair.reason,
            step=repair.step,
            done=list(repair.done),
            why=repair.why,
            quarantined_by=repair.quarantined_by,
            returned_at=repair.returned_at,
            domains=list(domains),
        )


@router.get("/health/nodes")
def health_nodes(
    ctx: Annotated[ApiContext, Depends(api_context)],
    _: Annotated[Principal, Depends(require(Permission.ENGINE_READ))],
) -> list[RepairOut]:
    """Every node the remediation ladder knows, with its stage."""
    ladder = ctx.engine.ladder
    return [RepairOut.of(r, ladder.domains(r)) for r in ladder.repairs()]


@router.post(
    "/health/nodes/{node}/clear",
    responses=refusal(409, "The node does not need a human (or is not on the ladder)."),
)
def clear_health_node(
    node: str,
    request: Request,
    ctx: Annotated[ApiContext, Depends(api_context)],
    user: Annotated[Principal, Depends(require(Permission.ENGINE_CONTROL))],
) -> RepairOut:
    """Clear a node that needs a human: its next fault may be remediated again. The node
    stays drained: return it to service yourself (``scontrol update state=resume``)."""
    try:
        repair = ctx.engine.ladder.clear(node, user.name)
    except ValueError as exc:
        raise HTTPException(409, str(exc)) from None
    request.state.gpuops_note = f"node {node} cleared: it may be remediated again"
    return RepairOut.of(repair, ctx.engine.ladder.domains(repair))
