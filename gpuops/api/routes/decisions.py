"""``/api/v1/decisions`` and ``/api/v1/approvals``: query decisions, explain one, list pending
approvals, grant or deny them. Reads the engine's state store; grant/deny go through the
engine, which runs the guardrails again (kill switch and pause still apply).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.routes.rules import policy_doc
from gpuops.api.schemas import ID_PATTERN, NAME_PATTERN
from gpuops.api.tokens import Permission, Principal
from gpuops.model.decisions import Suppression
from gpuops.model.records import decision_doc
from gpuops.runtime.approvals import ApprovalError
from gpuops.runtime.gate import RetryError
from gpuops.store.codecs import approval_doc, stored_decision_doc
from gpuops.store.interface import ApprovalStatus

router = APIRouter(tags=["decisions"])

Ctx = Annotated[ApiContext, Depends(api_context)]
DecisionId = Annotated[str, Path(pattern=ID_PATTERN, description="Decision id.")]
_SCAN = 10_000
"""Most recent decisions scanned for the filters the state store does not index."""


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
) -> Any:
    """Decisions, newest first, filtered."""
    filtered = verdict or transition or target or until is not None
    stored = ctx.engine.store.decisions(policy, since, _SCAN if filtered else limit)
    rows = [stored_decision_doc(s) for s in stored]
    settled = _settled_approvals(ctx)
    found = []
    for row in (_with_approval(r, settled.get(r["id"])) for r in rows):
        if verdict and not (row["verdict"] == verdict or row["verdict"].startswith(verdict + ":")):
            continue
        if transition and row["transition"] != transition:
            continue
        if target and target not in row["target"]["key"]:
            continue
        if until is not None and row["at"] > until:
            continue
        found.append(row)
        if len(found) >= limit:
            break
    return {"decisions": found}


_SETTLED_VERDICTS = {
    "denied": "suppressed:denied",
    "expired": "suppressed:approval_expired",
    "cancelled": "suppressed:approval_cancelled",
}
"""The verdict the audit records when a pending approval is settled without running."""


def _settled_approvals(ctx: ApiContext) -> dict[str, dict[str, Any]]:
    return {
        a.decision_id: approval_doc(a)
        for a in ctx.engine.store.approvals()
        if a.status is not ApprovalStatus.PENDING
    }


def _with_approval(row: dict[str, Any], approval: dict[str, Any] | None) -> dict[str, Any]:
    """A decision as it stands after its approval: denied, expired or cancelled ones carry the
    verdict their audit record has, a granted one says who granted it."""
    if approval is None or approval["status"] == "pending":
        return row
    status, user = approval["status"], approval.get("decided_by")
    row = {**row, "approval": {k: approval.get(k) for k in ("status", "decided_by", "decided_at")}}
    if status == "granted":
        return {**row, "reason": f"granted by {user}"}
    if row["verdict"] == "awaiting_approval" and status in _SETTLED_VERDICTS:
        reason = {"denied": f"denied by {user}", "expired": "nobody granted it in time"}
        row["verdict"] = _SETTLED_VERDICTS[status]
        row["reason"] = reason.get(status, "the condition cleared before anyone granted it")
    return row


def _decision(ctx: ApiContext, decision_id: str) -> dict[str, Any]:
    stored = ctx.engine.store.decision(decision_id)
    if stored is None:
        raise HTTPException(404, f"no decision {decision_id}")
    approval = ctx.engine.store.approval(decision_id)
    return _with_approval(
        stored_decision_doc(stored), None if approval is None else approval_doc(approval)
    )


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


def _suppression(ctx: ApiContext, row: dict[str, Any]) -> dict[str, Any] | None:
    """The suppression this decision recorded (still holding its target now, and how many
    re-decisions repeated it without a record), or the one before it that it ended."""
    held_before = int(row.get("held_repeats") or 0)
    if row["verdict"] not in _REDECIDED or row["transition"] not in ("fire", "clear"):
        if not held_before:
            return None
        return {
            "current": False,
            "repeats": held_before,
            "explanation": f"before this decision its target's previous suppression was decided "
            f"again {held_before} times without a record",
        }
    state = ctx.engine.store.policy_state(row["policy"]).targets.get(row["target"]["key"])
    current = (
        state is not None
        and state.held == row["verdict"]
        and state.held_since == row["at"]
        and state.active_since == row["episode_start"]
    )
    repeats = state.held_repeats if current and state is not None else None
    if current:
        text = (
            f"still held now: {row['verdict']} since {_iso(row['at'])}, decided again "
            f"{repeats} times since without a new record"
        )
    else:
        text = (
            f"recorded {_iso(row['at'])}; no longer what holds the target back (it acted, "
            "cleared, or a later decision has another verdict)"
        )
    if held_before:
        text += f"; {held_before} unrecorded repeats of an earlier suppression came before it"
    return {"current": current, "since": row["at"], "repeats": repeats, "explanation": text}


def _approval_line(approval: dict[str, Any]) -> str:
    status = approval["status"]
    if status == "pending":
        return f"approval: pending, expires {_iso(approval['expires_at'])}"
    by = f" by {approval['decided_by']}" if approval.get("decided_by") else ""
    at = f" at {_iso(approval['decided_at'])}" if approval.get("decided_at") else ""
    return f"approval: {status}{by}{at}"


@router.get("/decisions/{decision_id}")
def show_decision(
    decision_id: DecisionId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.DECISIONS_READ))],
) -> Any:
    """One decision as stored, with its outcome."""
    return _decision(ctx, decision_id)


@router.get("/decisions/{decision_id}/explain")
def explain_decision(
    decision_id: DecisionId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.DECISIONS_READ))],
) -> Any:
    """Why a decision was taken and what the guardrails made of it."""
    row = _decision(ctx, decision_id)
    policy = ctx.engine.rules.policy(row["policy"])
    found = ctx.engine.store.approval(decision_id)
    approval = None if found is None else approval_doc(found)
    evidence = row["evidence"]
    verdict: str = row["verdict"]
    lines = [
        f"policy {row['policy']} decided to {row['transition']} on {row['target']['key']}",
        f"because {evidence['expr']!r} returned {evidence['value']}"
        + (
            f" (pending since {_iso(evidence['pending_since'])})"
            if evidence["pending_since"]
            else ""
        ),
        f"guardrails: {verdict}" + (f" — {row['reason']}" if row.get("reason") else ""),
    ]
    suppression = _suppression(ctx, row)
    if suppression is not None:
        lines.append(suppression["explanation"])
    if approval is not None:
        lines.append(_approval_line(approval))
    if row.get("outcome"):
        outcome = row["outcome"]
        lines.append(
            f"outcome: {outcome['status']} after {outcome['attempts']} attempts"
            + (f": {outcome['error']}" if outcome.get("error") else "")
        )
    return {
        "id": decision_id,
        "policy": policy_doc(policy, detail=True) if policy else None,
        "policy_loaded": policy is not None,
        "expr": evidence["expr"],
        "evidence": evidence,
        "guardrails": {
            "verdict": verdict,
            "reason": row.get("reason", ""),
            "executed": verdict == "execute",
            "suppressed_by": verdict.partition(":")[2] or None,
            "suppression": suppression,
        },
        "action": row.get("action"),
        "status": row.get("status"),
        "outcome": row.get("outcome"),
        "approval": None
        if approval is None
        else {k: v for k, v in approval.items() if k != "decision"},
        "explanation": lines,
    }


@router.get("/approvals", tags=["approvals"])
def list_approvals(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.APPROVALS_READ))],
    status: Literal["pending", "granted", "denied", "expired"] | None = None,
) -> Any:
    """Approvals (expired ones are settled first), newest first."""
    ctx.engine.expire_approvals()
    found = ctx.engine.store.approvals(None if status is None else ApprovalStatus(status))
    return {"approvals": [approval_doc(a) for a in found]}


def _settle(ctx: ApiContext, decision_id: str, user: str, grant: bool) -> Any:
    try:
        decision = (ctx.engine.grant if grant else ctx.engine.deny)(decision_id, user)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except ApprovalError as exc:
        raise HTTPException(409, str(exc)) from None
    return decision_doc(decision)


@router.post("/approvals/{decision_id}/grant", tags=["approvals"])
def grant_approval(
    decision_id: DecisionId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> Any:
    """Run a decision that waits for approval (409 when it is not pending or not runnable)."""
    return _settle(ctx, decision_id, principal.name, grant=True)


@router.post("/approvals/{decision_id}/deny", tags=["approvals"])
def deny_approval(
    decision_id: DecisionId,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> Any:
    """Refuse a decision that waits for approval."""
    if ctx.engine.store.approval(decision_id) is None:
        raise HTTPException(404, f"no approval for decision {decision_id}")
    return _settle(ctx, decision_id, principal.name, grant=False)


@router.post("/decisions/{decision_id}/retry")
def retry_decision(
    decision_id: DecisionId,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.APPROVALS_DECIDE))],
) -> Any:
    """Decide again the target of a failed action at the next evaluation (a permanent failure
    is otherwise not retried within its episode); 409 when there is nothing to retry."""
    try:
        decision = ctx.engine.retry(decision_id)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except RetryError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"decision": decision.id, "policy": decision.policy, "target": decision.target.key}
