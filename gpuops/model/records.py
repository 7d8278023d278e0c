"""Plain JSON forms of decisions and outcomes: what the state database stores, the API serves
and the approval flow reads back. The inverse of ``decision_doc`` is ``decision_from_doc``.

Imports only ``gpuops.model.decisions``; used by ``gpuops.runtime``, ``gpuops.store.sqlite`` users
and the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
    Verdict,
    freeze,
)


def decision_doc(decision: Decision) -> dict[str, Any]:
    """The JSON form of a decision stored in the state database (and served by the API)."""
    action = decision.action
    return {
        "id": decision.id,
        "policy": decision.policy,
        "group": decision.group,
        "target": {"key": decision.target.key, "labels": dict(decision.target.labels)},
        "transition": decision.transition.value,
        "action": None
        if action is None
        else {"type": action.type, "executor": action.executor, "params": plain(action.params)},
        "verdict": decision.verdict.value,
        "reason": decision.reason,
        "mode": decision.mode,
        "at": decision.at,
        "episode_start": decision.episode_start,
        "repeat": decision.repeat,
        "evidence": {
            "expr": decision.evidence.expr,
            "value": decision.evidence.value,
            "pending_since": decision.evidence.pending_since,
            "observed_at": decision.evidence.observed_at,
        },
        "annotations": dict(decision.annotations),
        "labels": dict(decision.labels),
        "held_repeats": decision.held_repeats,
    }


def decision_from_doc(doc: Mapping[str, Any]) -> Decision:
    """The inverse of ``decision_doc``."""
    action = doc.get("action")
    ev = doc["evidence"]
    return Decision(
        id=doc["id"],
        policy=doc["policy"],
        group=doc["group"],
        target=Target(doc["target"]["key"], freeze(doc["target"]["labels"])),
        transition=Transition(doc["transition"]),
        action=None
        if action is None
        else ActionSpec(action["type"], action["executor"], freeze(action.get("params") or {})),
        evidence=Evidence(ev["expr"], ev["value"], ev["pending_since"], ev["observed_at"]),
        at=doc["at"],
        episode_start=doc["episode_start"],
        repeat=int(doc.get("repeat", 0)),
        verdict=Verdict(doc["verdict"]),
        reason=doc.get("reason", ""),
        mode=doc.get("mode", "enforce"),
        annotations=freeze(doc.get("annotations") or {}),
        labels=freeze(doc.get("labels") or {}),
        held_repeats=int(doc.get("held_repeats", 0)),
    )


def outcome_doc(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status.value,
        "attempts": outcome.attempts,
        "duration_s": outcome.duration_s,
        "error": outcome.error,
        "changed": plain(outcome.changed),
        "permanent": outcome.permanent,
    }


def outcome_from_doc(doc: Mapping[str, Any]) -> Outcome:
    """The ``Outcome`` of ``outcome_doc``'s form (the state file's)."""
    return Outcome(
        OutcomeStatus(doc["status"]),
        attempts=int(doc.get("attempts", 0)),
        duration_s=float(doc.get("duration_s", 0.0)),
        error=doc.get("error"),
        changed=freeze(doc.get("changed") or {}),
        permanent=bool(doc.get("permanent", False)),
    )


def plain(value: Any) -> Any:
    """``value`` as plain JSON types (mappings to dicts, sequences to lists)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
