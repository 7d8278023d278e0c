"""Request bodies the API validates (pydantic), and the refusals every route may answer.

Used by the route modules of ``gpuops.api.routes``; FastAPI turns them into the OpenAPI spec
(the answers of each resource are in ``gpuops.api.responses``). Unknown fields in user
requests are errors; Alertmanager payloads tolerate new fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from gpuops.api.responses import Out, absent_when_none
from gpuops.model.alerts import Alert as AlertValue
from gpuops.model.alerts import AlertStatus
from gpuops.model.decisions import freeze
from gpuops.model.rules.durations import parse_duration

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,199}$"
"""Policy names (as the rule schema allows them)."""
FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\.ya?ml$"
"""Rule file names: a plain name ending .yaml or .yml, no directories."""
ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


class ErrorOut(Out):
    """A refusal (4xx) or an engine that cannot take the request now (503)."""

    detail: str = Field(description="Why the request was refused.")


Responses = dict[int | str, dict[str, Any]]
"""What a route's ``responses=`` documents besides its answer: status -> model, description."""


def refusal(status: int, description: str, model: object = ErrorOut) -> Responses:
    """The OpenAPI of one refusal a route may answer (``model``: a class, or a union of them)."""
    return {status: {"model": model, "description": description}}


STANDBY = refusal(503, "A write sent to a standby replica: X-Gpuops-Leader names the leader.")
"""What a route that changes the engine's state answers on a standby (docs/ha.md)."""


class ProblemOut(Out):
    loc: list[str] = Field(description="Where: body, query, path or header, then the field.")
    msg: str


class InvalidRequestOut(Out):
    """422: the request does not validate (``errors``, one per problem), or a value in it
    cannot be used (``detail`` only)."""

    detail: str = Field(description="Every problem as where: what, joined by '; '.")
    errors: list[ProblemOut] | SkipJsonSchema[None] = absent_when_none()


class SettleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        default="", max_length=1000, description="Why it is granted or denied (audited)."
    )


class QuotaRequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Project.")
    gpus: int = Field(ge=1, le=100_000, strict=True, description="Extra GPUs wanted.")
    """Strict: ``true`` is not one GPU, ``"3"`` is not three."""
    duration: str | float = Field(
        description="How long: seconds, or a Prometheus duration such as 8h."
    )
    reason: str = Field(default="", max_length=1000)

    @field_validator("duration", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # JSON true would be 1 second
            raise ValueError("must be a duration (seconds, or such as 8h), not a boolean")
        return value

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str | float) -> float:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(value)
            except ValueError as exc:
                raise ValueError(f"not a duration: {exc}") from None
        if not 0 < seconds < float("inf"):
            raise ValueError("must be a positive duration")
        return seconds


class Alert(BaseModel):
    """One alert of an Alertmanager webhook notification (payload version 4)."""

    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str = Field(max_length=64)
    endsAt: str = Field(default="", max_length=64)
    generatorURL: str = Field(default="", max_length=4096)
    fingerprint: str = Field(min_length=1, max_length=64)

    def value(self) -> AlertValue:
        """The alert as the engine takes it (``gpuops.model.alerts.Alert``, frozen)."""
        return AlertValue(
            fingerprint=self.fingerprint,
            status=AlertStatus(self.status),
            labels=freeze(self.labels),
            annotations=freeze(self.annotations),
            starts_at=self.startsAt,
            ends_at=self.endsAt,
            generator_url=self.generatorURL,
        )


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook notification, version 4.

    ``alerts`` has no count of its own: a notification is bounded by its body
    (``api.alertmanager_max_body_bytes``, 413 before it is parsed) and taken, or answered 503
    for Alertmanager to retry, by the alert inbox (``api.alert_queue_size``:
    ``gpuops.runtime.alerts.AlertInbox.submit``), so that no group the body limit lets
    through is refused for good."""

    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    groupKey: str = Field(max_length=4096)
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = Field(max_length=1024)
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = Field(default="", max_length=4096)
    alerts: list[Alert]


class AlertsQueued(BaseModel):
    queued: int
