"""``/api/v1/decisions`` and ``/api/v1/approvals``: query decisions, explain one, list pending
approvals, grant or deny them. Reads the engine's state store; grant/deny go through the
engine, which runs the guardrails again (kill switch and pause still apply).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, Request

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.decisions import (
    ApprovalOut,
    ApprovalsOut,
    ApprovalWithDecisionOut,
    DecisionOut,
    DecisionsOut,
    ExplanationOut,
    GuardrailsOut,
    RetryOut,
    SettledApprovalOut,
    StoredDecisionOut,
    SuppressionOut,
)
from gpuops.api.responses.rules import PolicyDetailOut
from gpuops.api.schemas import ID_PATTERN, NAME_PATTERN, STANDBY, SettleIn, refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.model.decisions import Outcome, Suppression, Transition, Verdict
from gpuops.model.telling import (
    State,
    doing,
    effect,
    expr_lines,
    outcome_words,
    state,
    summary,
    value_in_words,
    verdict_words,
)
from gpuops.runtime.approvals import ApprovalError
from gpuops.runtime.gate import STEPS_RETRIED_ELSEWHERE, RetryError
from gpuops.store.interface import Approval, ApprovalStatus, DecisionStatus

router = APIRouter(tags=["decisions"])

Ctx = Annotated[ApiContext, Depends(api_context)]
DecisionId = Annotated[str, Path(pattern=ID_PATTERN, description="Decision id.")]
_SCAN = 10_000
"""Most recent decisions scanned for the filters the state store does not index."""
_UNKNOWN = refusal(404, "No such decision.")
_NOT_SETTLED = refusal(409, "Not pending, or not runnable.")


@router.get("/decisions")
def list_decisions(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.DECISIONS_READ))],
    policy: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    verdict: Annotated[
        str | None,
        Query(
            max_length=100,
            description="execute, dry_run, suppressed (any "
            "reason) or suppressed:<reason>, awaiting_approval.",
        ),
    ] = None,
    transition: Literal["fire", "clear", "resolve"] | None = None,
    target: Annotated[
        str | None, Query(max_length=200, description="Substring of the target key.")
    ] = None,
    since: Annotated[float | None, Query(ge=0, le=1e11, description="Unix seconds.")] = None,
    until: Annotated[float | None, Query(ge=0, le=1e11, description="Unix seconds.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DecisionsOut:
    """Decisions, newest first, filtered."""
    filtered = verdict or transition or target or until is not None
    stored = ctx.engine.store.decisions(policy, since, _SCAN if filtered else limit)
    settled = _settled_approvals(ctx)
    found: list[StoredDecisionOut] = []
    for s in stored:
        row = _in_words(_with_approval(StoredDecisionOut.stored(s), settled.get(s.id)))
        if verdict and not (row.verdict == verdict or row.verdict.startswith(verdict + ":")):
            continue
        if transition and row.transition != transition:
            continue
        if target and target not in row.target.key:
            continue
        if until is not None and row.at > until:
            continue
        found.append(row)
        if len(found) >= limit:
            break
    return DecisionsOut(decisions=_paired(ctx, found))


def _episode(row: StoredDecisionOut) -> tuple[str, str, float]:
    return row.policy, row.target.key, row.episode_start


def _paired(ctx: ApiContext, rows: list[StoredDecisionOut]) -> list[StoredDecisionOut]:
    """``rows`` with each fire that acted and the undo of its episode naming each other (the
    newest fire of the episode, when it repeated), and a fire whose undo ran ``undone``; the
    other half of a pair not among ``rows`` (filtered out, or beyond the limit) is read from
    the store, one query per policy."""
    fires: dict[tuple[str, str, float], StoredDecisionOut] = {}
    undos: dict[tuple[str, str, float], StoredDecisionOut] = {}
    for row in rows:
        if row.action is not None:
            into = fires if row.transition is Transition.FIRE else undos
            into.setdefault(_episode(row), row)
    lacking: dict[str, float] = {}  # policy -> the earliest episode whose other half is unseen
    for key in (fires.keys() - undos.keys()) | (undos.keys() - fires.keys()):
        lacking[key[0]] = min(key[2], lacking.get(key[0], key[2]))
    for policy, since in lacking.items():
        for stored in ctx.engine.store.decisions(policy, since, _SCAN):
            other = stored.decision
            if other.action is not None:
                into = fires if other.transition is Transition.FIRE else undos
                key = (other.policy, other.target.key, other.episode_start)
                if key not in into:
                    into[key] = _in_words(StoredDecisionOut.stored(stored))
    out = []
    for row in rows:
        key = _episode(row)
        if row.action is not None and row.transition is Transition.FIRE and key in undos:
            undo = undos[key]
            row = _in_words(row, undone=undo.state == State.DONE).model_copy(
                update={"undo": undo.id}
            )
        elif row.action is not None and row.transition is not Transition.FIRE and key in fires:
            row = row.model_copy(update={"undoes": fires[key].id})
        out.append(row)
    return out


def _outcome(row: StoredDecisionOut) -> Outcome | None:
    return None if row.outcome is None else Outcome(**dict(row.outcome))


def _in_words(row: StoredDecisionOut, undone: bool = False) -> StoredDecisionOut:
    """``row`` with where it stands and what its action changed, in words
    (``gpuops.model.telling``)."""
    verb = row.action.type if row.action is not None else None
    outcome = _outcome(row)
    stands = state(
        row.verdict,
        has_action=row.action is not None,
        started=row.status is DecisionStatus.STARTED,
        outcome=outcome,
        verb=verb,
        undone=undone,
    )
    told = ""
    if outcome is not None:
        told = effect(verb, outcome.changed).text if outcome.ok else (outcome.error or "")
    return row.model_copy(update={"state": stands.value, "effect": told})


def _pair_of(ctx: ApiContext, row: StoredDecisionOut) -> StoredDecisionOut | None:
    """The undo of a fire that acted, or the fire an undo undoes (same policy, target and
    episode), in words."""
    if row.action is None:
        return None
    stored = ctx.engine.store.decisions(row.policy, row.episode_start, _SCAN)
    fire = row.transition is Transition.FIRE
    for s in stored:  # newest first
        other = s.decision
        if (
            other.id != row.id
            and other.action is not None
            and other.target.key == row.target.key
            and other.episode_start == row.episode_start
            and (other.transition is Transition.FIRE) is not fire
        ):
            return _in_words(StoredDecisionOut.stored(s))
    return None


_SETTLED_VERDICTS = {
    ApprovalStatus.DENIED: Verdict.SUPPRESSED_DENIED,
    ApprovalStatus.EXPIRED: Verdict.SUPPRESSED_APPROVAL_EXPIRED,
    ApprovalStatus.CANCELLED: Verdict.SUPPRESSED_APPROVAL_CANCELLED,
}
"""The verdict the audit records when a pending approval is settled without running."""


def _settled_approvals(ctx: ApiContext) -> dict[str, Approval]:
    return {
        a.decision_id: a
        for a in ctx.engine.store.approvals()
        if a.status is not ApprovalStatus.PENDING
    }


def _with_approval(row: StoredDecisionOut, approval: Approval | None) -> StoredDecisionOut:
    """A decision as it stands after its approval: denied, expired or cancelled ones carry the
    verdict their audit record has, a granted one says who granted it."""
    if approval is None or approval.status is ApprovalStatus.PENDING:
        return row
    status, user = approval.status, approval.decided_by
    settled = SettledApprovalOut(status=status, decided_by=user, decided_at=approval.decided_at)
    row = row.model_copy(update={"approval": settled})
    if status is ApprovalStatus.GRANTED:
        return row.model_copy(update={"reason": f"granted by {user}"})
    if row.verdict is Verdict.AWAITING_APPROVAL and status in _SETTLED_VERDICTS:
        reason = {
            ApprovalStatus.DENIED: f"denied by {user}",
            ApprovalStatus.EXPIRED: "nobody granted it in time",
        }
        return row.model_copy(
            update={
                "verdict": _SETTLED_VERDICTS[status],
                "reason": reason.get(status, "the condition cleared before anyone granted it"),
            }
        )
    return row


def _decision(ctx: ApiContext, decision_id: str) -> StoredDecisionOut:
    stored = ctx.engine.store.decision(decision_id)
    if stored is None:
        raise HTTPException(404, f"no decision {decision_id}")
    return _with_approval(StoredDecisionOut.stored(stored), ctx.engine.store.approval(decision_id))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_REDECIDED = frozenset(
    s.verdict
    for s in (
        Suppression.KILL_SWITCH,
        Suppression.PAUSED,
        Suppression.COOLDOWN,
        Suppression.MAX_PER_HOUR,
        Suppression.MAX_FRACTION,
        Suppression.GLOBAL_BUDGET,
    )
)
"""The suppressions a target's fire is decided again after (recorded once, then counted)."""


def _suppression(ctx: ApiContext, row: StoredDecisionOut) -> SuppressionOut | None:
    """The suppression this decision recorded (still holding its target now, and how many
    re-decisions repeated it without a record), or the one before it that it ended."""
    held_before = row.held_repeats
    if row.verdict not in _REDECIDED or row.transition not in ("fire", "clear"):
        if not held_before:
            return None
        return SuppressionOut(
            current=False,
            repeats=held_before,
            explanation=f"before this decision its target's previous suppression was decided "
            f"again {held_before} times without a record",
        )
    state = ctx.engine.store.policy_state(row.policy).targets.get(row.target.key)
    current = (
        state is not None
        and state.held == row.verdict
        and state.held_since == row.at
        and state.active_since == row.episode_start
    )
    repeats = state.held_repeats if current and state is not None else None
    if current:
        text = (
            f"still held now: {row.verdict} since {_iso(row.at)}, decided again "
            f"{repeats} times since without a new record"
        )
    else:
        text = (
            f"recorded {_iso(row.at)}; no longer what holds the target back (it acted, "
            "cleared, or a later decision has another verdict)"
        )
    if held_before:
        text += f"; {held_before} unrecorded repeats of an earlier suppression came before it"
    return SuppressionOut(current=current, since=row.at, repeats=repeats, explanation=text)


def _approval_line(approval: ApprovalOut) -> str:
    status = approval.status
    if status is ApprovalStatus.PENDING:
        return f"approval: pending, expires {_iso(approval.expires_at)}"
    by = f" by {approval.decided_by}" if approval.decided_by else ""
    at = f" at {_iso(approval.decided_at)}" if approval.decided_at else ""
    return f"approval: {status}{by}{at}"


@router.get("/decisions/{decision_id}", responses=_UNKNOWN)
def show_decision(
    decision_id: DecisionId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.DECISIONS_READ))],
) -> StoredDecisionOut:
    """One decision as stored, with its outcome, its state and what it changed in words."""
    row = _decision(ctx, decision_id)
    pair = _pair_of(ctx, row)
    fire = row.transition is Transition.FIRE
    undone = fire and pair is not None and pair.state == State.DONE
    row = _in_words(row, undone=undone)
    if pair is None:
        return row
    return row.model_copy(update={"undo": pair.id} if fire else {"undoes": pair.id})


@router.get("/decisions/{decision_id}/explain", responses=_UNKNOWN)
def explain_decision(
    decision_id: DecisionId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.DECISIONS_READ))],
) -> ExplanationOut:
    """Why a decision was taken and what the guardrails made of it."""
    row = _decision(ctx, decision_id)
    pair = _pair_of(ctx, row)
    undone = row.transition is Transition.FIRE and pair is not None and pair.state == State.DONE
    row = _in_words(row, undone=undone)
    policy = ctx.engine.rules.policy(row.policy)
    found = ctx.engine.store.approval(decision_id)
    approval = None if found is None else ApprovalOut.of(found)
    evidence, verdict = row.evidence, row.verdict
    verb = row.action.type if row.action is not None else None
    value = value_in_words(evidence.expr, evidence.value)
    lines = [
        f"policy {row.policy} decided to {doing(row.transition, verb)} on {row.target.key}",
        (
            f"because of {evidence.expr}"
            if evidence.value is None
            else f"because its expression returned {value} for this target"
        )
        + (f" (pending since {_iso(evidence.pending_since)})" if evidence.pending_since else ""),
        f"guardrails: {verdict_words(verdict, row.reason)}",
    ]
    suppression = _suppression(ctx, row)
    if approval is not None:
        lines.append(_approval_line(approval))
    outcome = _outcome(row)
    told: list[str] = []
    if outcome is not None:
        lines.append(f"outcome: {outcome_words(outcome, verb)}")
        if outcome.ok:
            told = list(effect(verb, outcome.changed).sentences)
    if pair is not None:
        lines.append(
            f"undone by decision {pair.id}: {pair.state}"
            if row.transition is Transition.FIRE
            else f"undoes decision {pair.id}"
        )
    if suppression is not None:
        lines.append(suppression.explanation)
    stored = ctx.engine.store.decision(decision_id)
    return ExplanationOut(
        id=decision_id,
        policy=PolicyDetailOut.of(policy) if policy else None,
        policy_loaded=policy is not None,
        expr=evidence.expr,
        evidence=evidence,
        guardrails=GuardrailsOut(
            verdict=verdict,
            reason=row.reason,
            executed=verdict is Verdict.EXECUTE,
            suppressed_by=verdict.suppression,
            suppression=suppression,
        ),
        action=row.action,
        status=row.status,
        outcome=row.outcome,
        approval=approval,
        explanation=lines,
        summary=summary(row.annotations),
        value=value,
        expr_lines=expr_lines(evidence.expr),
        state=row.state or "",
        effect=told,
        undo=pair,
        can_retry=stored is not None
        and stored.failed
        and stored.retried_at is None
        and stored.decision.group not in STEPS_RETRIED_ELSEWHERE,  # a runner's step
    )


@router.get("/approvals", tags=["approvals"])
def list_approvals(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.APPROVALS_READ))],
    status: Literal["pending", "granted", "denied", "expired"] | None = None,
) -> ApprovalsOut:
    """Approvals (expired ones are settled first), newest first."""
    ctx.engine.expire_approvals()
    found = ctx.engine.store.approvals(None if status is None else ApprovalStatus(status))
    return ApprovalsOut(approvals=[ApprovalWithDecisionOut.with_decision(a) for a in found])


def _settle(ctx: ApiContext, decision_id: str, user: str, grant: bool) -> DecisionOut:
    try:
        decision = (ctx.engine.grant if grant else ctx.engine.deny)(decision_id, user)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except ApprovalError as exc:
        raise HTTPException(409, str(exc)) from None
    return DecisionOut.of(decision)


def _note(request: Request, body: Annotated[SettleIn | None, Body()] = None) -> None:
    """The reason a grant or denial gives (optional JSON ``{"reason": ...}``): the audit
    record of the request carries it (``gpuops.api.middleware``)."""
    if body is not None and body.reason.strip():
        request.state.gpuops_note = body.reason.strip()


@router.post(
    "/approvals/{decision_id}/grant",
    tags=["approvals"],
    responses=_UNKNOWN | _NOT_SETTLED | STANDBY,
    dependencies=[Depends(_note)],
)
def grant_approval(
    decision_id: DecisionId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> DecisionOut:
    """Run a decision that waits for approval (409 when it is not pending or not runnable)."""
    return _settle(ctx, decision_id, principal.name, grant=True)


@router.post(
    "/approvals/{decision_id}/deny",
    tags=["approvals"],
    responses=_UNKNOWN | _NOT_SETTLED | STANDBY,
    dependencies=[Depends(_note)],
)
def deny_approval(
    decision_id: DecisionId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> DecisionOut:
    """Refuse a decision that waits for approval."""
    if ctx.engine.store.approval(decision_id) is None:
        raise HTTPException(404, f"no approval for decision {decision_id}")
    return _settle(ctx, decision_id, principal.name, grant=False)


@router.post(
    "/decisions/{decision_id}/retry",
    responses=_UNKNOWN | refusal(409, "Nothing to retry.") | STANDBY,
)
def retry_decision(
    decision_id: DecisionId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> RetryOut:
    """Decide again the target of a failed action at the next evaluation (a permanent failure
    is otherwise not retried within its episode); 409 when there is nothing to retry."""
    try:
        decision = ctx.engine.retry(decision_id)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except RetryError as exc:
        raise HTTPException(409, str(exc)) from None
    return RetryOut(decision=decision.id, policy=decision.policy, target=decision.target.key)
