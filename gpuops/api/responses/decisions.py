"""The answers of ``/api/v1/decisions`` and ``/api/v1/approvals``: a decision (as judged, and as
stored with its outcome and its approval), an approval, the explanation of a decision, and an
accepted retry. Built from ``gpuops.model.decisions`` and ``gpuops.store.interface`` values by
``gpuops.api.routes.decisions``; the console renders the same models.
"""

from __future__ import annotations

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from gpuops.api.responses import JsonObject, Number, Out, absent_when_none
from gpuops.api.responses.rules import PolicyDetailOut
from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Suppression,
    Transition,
    Verdict,
)
from gpuops.model.records import plain
from gpuops.store.interface import Approval, ApprovalStatus, DecisionStatus, StoredDecision


class TargetOut(Out):
    key: str
    labels: dict[str, str]


class ActionOut(Out):
    type: str
    executor: str
    params: JsonObject

    @classmethod
    def of(cls, action: ActionSpec) -> ActionOut:
        return cls(type=action.type, executor=action.executor, params=plain(action.params))


class EvidenceOut(Out):
    expr: str
    value: Number | None = Field(description="What the expression returned for the target.")
    pending_since: Number | None
    observed_at: Number

    @classmethod
    def of(cls, evidence: Evidence) -> EvidenceOut:
        return cls(
            expr=evidence.expr,
            value=evidence.value,
            pending_since=evidence.pending_since,
            observed_at=evidence.observed_at,
        )


class OutcomeOut(Out):
    status: OutcomeStatus
    attempts: int
    duration_s: Number
    error: str | None
    changed: JsonObject = Field(description="What the executor reports it changed.")
    permanent: bool

    @classmethod
    def of(cls, outcome: Outcome) -> OutcomeOut:
        return cls(
            status=outcome.status,
            attempts=outcome.attempts,
            duration_s=outcome.duration_s,
            error=outcome.error,
            changed=plain(outcome.changed),
            permanent=outcome.permanent,
        )


class DecisionOut(Out):
    """A decision as the guardrails judged it."""

    id: str
    policy: str
    group: str
    target: TargetOut
    transition: Transition
    action: ActionOut | None
    verdict: Verdict
    reason: str
    mode: str
    at: Number
    episode_start: Number
    repeat: int
    evidence: EvidenceOut
    annotations: dict[str, str]
    labels: dict[str, str]
    held_repeats: int

    @classmethod
    def of(cls, decision: Decision) -> DecisionOut:
        action = decision.action
        return cls(
            id=decision.id,
            policy=decision.policy,
            group=decision.group,
            target=TargetOut(key=decision.target.key, labels=dict(decision.target.labels)),
            transition=decision.transition,
            action=None if action is None else ActionOut.of(action),
            verdict=decision.verdict,
            reason=decision.reason,
            mode=decision.mode,
            at=decision.at,
            episode_start=decision.episode_start,
            repeat=decision.repeat,
            evidence=EvidenceOut.of(decision.evidence),
            annotations=dict(decision.annotations),
            labels=dict(decision.labels),
            held_repeats=decision.held_repeats,
        )


class SettledApprovalOut(Out):
    """How a decision's approval was settled."""

    status: ApprovalStatus
    decided_by: str | None
    decided_at: Number | None


class StoredDecisionOut(DecisionOut):
    """A decision as stored: where it stands, its outcome, and once settled its approval
    (a denied, expired or cancelled one shows the verdict its audit record has)."""

    status: DecisionStatus
    outcome: OutcomeOut | None
    retried_at: Number | SkipJsonSchema[None] = absent_when_none()
    """When an admin's retry of it was accepted."""
    approval: SettledApprovalOut | SkipJsonSchema[None] = absent_when_none()
    state: str | SkipJsonSchema[None] = absent_when_none()
    """Where it stands, in words: waiting for approval, held, dry run, running, done, no
    effect (it ran and changed nothing its verb promises), failed, undone, recorded."""
    effect: str | SkipJsonSchema[None] = absent_when_none()
    """What its action changed, in words (or why it failed)."""
    undo: str | SkipJsonSchema[None] = absent_when_none()
    """The id of the decision that undid this one (its target cleared)."""
    undoes: str | SkipJsonSchema[None] = absent_when_none()
    """The id of the decision this one undoes."""

    @classmethod
    def stored(cls, stored: StoredDecision) -> StoredDecisionOut:
        return cls(
            **dict(DecisionOut.of(stored.decision)),
            status=stored.status,
            outcome=None if stored.outcome is None else OutcomeOut.of(stored.outcome),
            retried_at=stored.retried_at,
        )


class DecisionsOut(Out):
    decisions: list[StoredDecisionOut]


class ApprovalOut(Out):
    """A decision of an ``approval: required`` policy waiting for (or settled by) an admin."""

    decision_id: str
    policy: str
    target: str = Field(description="The target's key.")
    requested_at: Number
    expires_at: Number
    status: ApprovalStatus
    decided_by: str | None
    decided_at: Number | None

    @classmethod
    def of(cls, approval: Approval) -> ApprovalOut:
        return cls(
            decision_id=approval.decision_id,
            policy=approval.policy,
            target=approval.target,
            requested_at=approval.requested_at,
            expires_at=approval.expires_at,
            status=approval.status,
            decided_by=approval.decided_by,
            decided_at=approval.decided_at,
        )


class ApprovalWithDecisionOut(ApprovalOut):
    decision: DecisionOut = Field(description="The decision as it began to wait.")

    @classmethod
    def with_decision(cls, approval: Approval) -> ApprovalWithDecisionOut:
        return cls(**dict(ApprovalOut.of(approval)), decision=DecisionOut.of(approval.decision))


class ApprovalsOut(Out):
    approvals: list[ApprovalWithDecisionOut]


class SuppressionOut(Out):
    """The suppression a decision recorded, or the unrecorded ones before it."""

    current: bool = Field(description="It still holds the target back now.")
    since: Number | SkipJsonSchema[None] = absent_when_none()
    repeats: int | None = Field(
        description="Times it was decided again without a record (None: no longer known)."
    )
    explanation: str


class GuardrailsOut(Out):
    verdict: Verdict
    reason: str
    executed: bool
    suppressed_by: Suppression | None
    suppression: SuppressionOut | None


class ExplanationOut(Out):
    """Why a decision was taken and what the guardrails made of it."""

    id: str
    policy: PolicyDetailOut | None = Field(description="The policy, while it is loaded.")
    policy_loaded: bool
    expr: str
    evidence: EvidenceOut
    guardrails: GuardrailsOut
    action: ActionOut | None
    status: DecisionStatus
    outcome: OutcomeOut | None
    approval: ApprovalOut | None
    explanation: list[str] = Field(description="The same, in sentences.")
    summary: str = Field(description="The policy's summary (or description) for this target.")
    value: str = Field(description="What the expression returned, in words (25%, down, 36).")
    expr_lines: list[str] = Field(description="The expression, line by line.")
    state: str = Field(description="Where the decision stands, in words.")
    effect: list[str] = Field(description="What its action changed, one sentence each.")
    undo: StoredDecisionOut | None = Field(
        description="Its undo (for a fire), or the fire it undoes (for a clear)."
    )
    can_retry: bool = Field(description="Its action failed and may be retried once (POST retry).")


class RetryOut(Out):
    """A retry accepted: the target is decided again at the next evaluation."""

    decision: str
    policy: str
    target: str = Field(description="The target's key.")
