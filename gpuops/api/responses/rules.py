"""The answers of ``/api/v1/rules`` and ``/api/v1/rule-files``: policies (listed, and every
setting of one), a posted file's check, a reload, a written file, and the 422 refusals of the
last two. Built from ``gpuops.model.rules`` values by ``gpuops.api.routes.rules``; the
explanation of a decision (``gpuops.api.responses.decisions``) embeds ``PolicyDetailOut``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from gpuops.api.responses import JsonObject, Number, Out, absent_when_none
from gpuops.model.decisions import ActionSpec
from gpuops.model.records import plain
from gpuops.model.rules.model import Policy, RuleError


class PolicyActionOut(Out):
    type: str = Field(description="The verb, e.g. migrate.")
    executor: str

    @classmethod
    def of(cls, action: ActionSpec) -> PolicyActionOut:
        return cls(type=action.type, executor=action.executor)


class PolicyActionDetailOut(PolicyActionOut):
    params: JsonObject

    @classmethod
    def of(cls, action: ActionSpec) -> PolicyActionDetailOut:
        return cls(type=action.type, executor=action.executor, params=plain(action.params))


class PolicyOut(Out):
    """A running policy, in short."""

    name: str
    group: str
    mode: str = Field(json_schema_extra={"enum": ["enforce", "dry-run"]})
    action: PolicyActionOut
    trigger: dict[str, str] | None = Field(
        description="The Alertmanager alert labels that trigger it (None: its query does)."
    )
    schedule: str | None = Field(description="Cron expression, when it runs on a schedule.")
    source: str = Field(description="file:line of its definition.")


class LastEvaluationOut(Out):
    at: Number = Field(description="Evaluation time, Unix seconds.")
    skipped: str | None = Field(description="Why it did not evaluate (a failed or stale query).")


class ListedPolicyOut(PolicyOut):
    last_evaluation: LastEvaluationOut | None


class PolicyDetailOut(PolicyOut):
    """A running policy, every setting (docs/policies.md)."""

    action: PolicyActionDetailOut
    description: str
    expr: str | None
    clear_expr: str | None
    for_s: Number
    keep_firing_for_s: Number
    target: list[str] | None = Field(description="Labels that identify what is acted on.")
    on_clear: PolicyActionOut | None
    cooldown_s: Number
    repeat_interval_s: Number | None
    max_per_hour: int | None
    max_fraction: Number | None
    approval: str = Field(json_schema_extra={"enum": ["none", "required"]})
    on_no_data: str = Field(json_schema_extra={"enum": ["hold", "skip"]})
    labels: dict[str, str]
    annotations: dict[str, str]

    @classmethod
    def of(cls, policy: Policy) -> PolicyDetailOut:
        return cls(
            **_summary(policy),
            action=PolicyActionDetailOut.of(policy.action),
            description=policy.description,
            expr=policy.expr,
            clear_expr=policy.clear_expr,
            for_s=policy.for_s,
            keep_firing_for_s=policy.keep_firing_for_s,
            target=list(policy.target) if policy.target else None,
            on_clear=None if policy.on_clear is None else PolicyActionOut.of(policy.on_clear),
            cooldown_s=policy.cooldown_s,
            repeat_interval_s=policy.repeat_interval_s,
            max_per_hour=policy.max_per_hour,
            max_fraction=policy.max_fraction,
            approval=policy.approval,
            on_no_data=policy.on_no_data,
            labels=dict(policy.labels),
            annotations=dict(policy.annotations),
        )


def listed_policy(policy: Policy, last: LastEvaluationOut | None) -> ListedPolicyOut:
    return ListedPolicyOut(
        **_summary(policy), action=PolicyActionOut.of(policy.action), last_evaluation=last
    )


class _Summary(TypedDict):
    """The settings ``PolicyOut`` shows, shared by its two longer forms."""

    name: str
    group: str
    mode: str
    trigger: dict[str, str] | None
    schedule: str | None
    source: str


def _summary(policy: Policy) -> _Summary:
    return _Summary(
        name=policy.name,
        group=policy.group,
        mode=policy.mode,
        trigger=dict(policy.trigger_alertmanager) if policy.trigger_alertmanager else None,
        schedule=policy.schedule,
        source=policy.source,
    )


class ReloadStateOut(Out):
    """The last reload tried."""

    ok: bool
    at: Number
    errors: list[str] = Field(description="file:line: message, when it failed.")


class RulesOut(Out):
    files: list[str]
    policies: list[ListedPolicyOut]
    reload: ReloadStateOut | None


class RuleProblemOut(Out):
    """One problem in a rule file."""

    file: str
    line: int
    message: str
    text: str = Field(description="file:line: message")

    @classmethod
    def of(cls, error: RuleError) -> RuleProblemOut:
        return cls(file=error.file, line=error.line, message=error.message, text=str(error))


def problems(errors: Sequence[RuleError]) -> list[RuleProblemOut]:
    return [RuleProblemOut.of(e) for e in errors]


class ValidationOut(Out):
    """A posted rule file checked as the engine would load it."""

    ok: bool
    policies: int
    promql_checked: bool
    note: str | SkipJsonSchema[None] = absent_when_none()
    """Why PromQL was not checked although asked (no promtool)."""
    errors: list[RuleProblemOut]


class ReloadOut(Out):
    ok: bool
    policies: int


class RuleFileWrittenOut(ReloadOut):
    file: str


class RuleFilesOut(Out):
    files: list[str]


class ReloadRefusedOut(Out):
    """422: the rules did not load; the running ones stay."""

    detail: str
    errors: list[str] = Field(description="file:line: message, files named as in the rules dir.")


class RuleFileRefusedOut(Out):
    """422: the file is not a valid rule file; nothing was written."""

    detail: str
    errors: list[RuleProblemOut]
