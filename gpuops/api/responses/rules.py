"""The answers of ``/api/v1/rules`` and ``/api/v1/rule-files``: policies (listed, and every
setting of one), a posted file's check, a reload, a written file, and the 422 refusals of the
last two. Built from ``gpuops.model.rules`` values by ``gpuops.api.routes.rules``; the
explanation of a decision (``gpuops.api.responses.decisions``) embeds ``PolicyDetailOut``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypedDict

from pydantic import ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from gpuops.api.responses import JsonObject, Number, Out, absent_when_none
from gpuops.model.decisions import ActionSpec
from gpuops.model.readiness import Readiness
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
    expr: str | None = Field(description="Its PromQL (None: triggered by alerts alone).")
    for_s: Number = Field(description="How long a target stays pending before it fires.")
    cooldown_s: Number
    max_per_hour: int | None
    repeat_interval_s: Number | None


class TargetReadinessOut(Out):
    """One target of a policy pending or firing now, and when it may act next."""

    key: str
    labels: dict[str, str]
    status: str = Field(json_schema_extra={"enum": ["pending", "firing", "clearing"]})
    since: Number = Field(description="When it entered the result (its episode's start).")
    value: Number | None
    next_at: Number | None = Field(
        description="Earliest time it may act (None: not again before it clears and fires "
        "anew); the kill switch, a pause, max_fraction and the global budget can hold it longer."
    )
    waits_for: str = Field(description="What it waits for, in words (for 5m, cooldown 1h, ...).")

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, readiness: Readiness) -> TargetReadinessOut:
        return cls.model_validate(readiness)


class TargetsOut(Out):
    """A policy's targets pending or firing now (the first ``limit``) and how many in all."""

    policy: str
    total: int
    targets: list[TargetReadinessOut]


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


def listed_policy(
    policy: Policy, last: LastEvaluationOut | None, shown: Callable[[str], str] = str
) -> ListedPolicyOut:
    """``policy`` in short; ``shown`` names its source file as the rules directory does."""
    summary = _summary(policy)
    summary["source"] = shown(summary["source"])
    return ListedPolicyOut(
        **summary,
        action=PolicyActionOut.of(policy.action),
        last_evaluation=last,
        expr=policy.expr,
        for_s=policy.for_s,
        cooldown_s=policy.cooldown_s,
        max_per_hour=policy.max_per_hour,
        repeat_interval_s=policy.repeat_interval_s,
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
