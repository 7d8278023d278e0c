"""The decision document built the plain way, field by field (the helpers it shares with
``gpuops.audit.documents`` imported): the reference that the one-pass ``decision_document``
and the spool entries of ``gpuops.audit.lines`` must equal field for field and value for value
(tests/unit/audit/test_document_reference.py). Not a test module."""

from __future__ import annotations

import math
from typing import Any

from gpuops.audit.documents import (
    DECISION_DATASET,
    ECS_VERSION,
    _number,
    _plain,
    event_id,
    iso,
)
from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, Verdict
from gpuops.model.telling import effect, state


def _base(dataset: str, namespace: str, at: float, now: float) -> dict[str, Any]:
    return {
        "@timestamp": iso(at),
        "ecs": {"version": ECS_VERSION},
        "data_stream": {"type": "logs", "dataset": dataset, "namespace": namespace},
        "event": {"kind": "event", "dataset": dataset, "module": "gpuops", "created": iso(now)},
    }


def _decision_outcome(decision: Decision, outcome: Outcome | None) -> str:
    if outcome is None or decision.verdict != Verdict.EXECUTE.value:
        return "unknown"
    if outcome.status is OutcomeStatus.SUCCESS:
        return "success"
    if outcome.status is OutcomeStatus.FAILURE:
        return "failure"
    return "unknown"


def decision_document(
    decision: Decision, outcome: Outcome | None, host_name: str, namespace: str, now: float
) -> dict[str, Any]:
    """The document of one decision (``outcome`` None when it was not executed)."""
    status = outcome.status.value if outcome is not None else "none"
    ecs_outcome = _decision_outcome(decision, outcome)
    action = decision.action.type if decision.action is not None else decision.transition.value
    doc = _base(DECISION_DATASET, namespace, decision.at, now)
    executed = ecs_outcome in ("success", "failure")
    doc["event"].update(
        {
            "id": event_id(decision.id, decision.verdict, status),
            "category": ["host"],
            "type": ["change"] if executed else ["info"],
            "action": action,
            "outcome": ecs_outcome,
        }
    )
    if decision.reason:
        doc["event"]["reason"] = decision.reason
    if outcome is not None and math.isfinite(outcome.duration_s):
        doc["event"]["duration"] = int(round(outcome.duration_s * 1e9))
    target = ", ".join(f"{k}={v}" for k, v in sorted(decision.target.labels.items()))
    message = f"{decision.policy} {decision.transition.value} on {target or decision.target.key}"
    message += f": {decision.verdict}"
    if decision.reason:
        message += f" ({decision.reason})"
    if outcome is not None:
        message += f", {outcome.status.value}"
        if outcome.error:
            message += f": {outcome.error}"
    doc["message"] = message
    doc["rule"] = {"name": decision.policy, "ruleset": decision.group}
    doc["host"] = {"name": host_name}
    doc["labels"] = {str(k): str(v) for k, v in decision.target.labels.items()}
    gpuops: dict[str, Any] = {
        "decision": {
            "id": decision.id,
            "episode_start": iso(decision.episode_start),
            "repeat": decision.repeat,
        },
        "verdict": decision.verdict,
        "reason": decision.reason,
        "transition": decision.transition.value,
        "mode": decision.mode,
        "target": {"key": decision.target.key, "labels": dict(doc["labels"])},
        "evidence": {
            "expr": decision.evidence.expr,
            "value": _number(decision.evidence.value),
            "observed_at": iso(decision.evidence.observed_at),
        },
    }
    if decision.held_repeats:  # the suppression before this record, decided again unrecorded
        gpuops["decision"]["held_repeats"] = decision.held_repeats
    if decision.evidence.pending_since is not None:
        gpuops["evidence"]["pending_since"] = iso(decision.evidence.pending_since)
    if decision.labels:
        gpuops["policy"] = {"labels": {str(k): str(v) for k, v in decision.labels.items()}}
    if decision.action is not None:
        gpuops["executor"] = decision.action.executor
        gpuops["action"] = {"type": decision.action.type, "params": _plain(decision.action.params)}
    if outcome is not None:
        gpuops["outcome"] = {
            "status": outcome.status.value,
            "attempts": outcome.attempts,
            "changed": _plain(outcome.changed),
        }
        verb = decision.action.type if decision.action is not None else None
        gpuops["outcome"]["state"] = state(
            Verdict(decision.verdict),
            has_action=decision.action is not None,
            started=False,
            outcome=outcome,
            verb=verb,
        ).value
        if outcome.ok:
            gpuops["outcome"]["effect"] = effect(verb, outcome.changed).text
        if outcome.error:
            doc["error"] = {"message": outcome.error}
    doc["gpuops"] = gpuops
    return doc
