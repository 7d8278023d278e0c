"""One JSON codec per stored type: what a backend writes into its JSON columns (and the API
serves), and the inverse. Each pair round-trips (``tests/unit/store/test_codecs.py``).

Decisions and outcomes use ``gpuops.model.records``' forms; this module adds the store's
aggregates (``gpuops.store.interface``'s values), the targets of a policy state and the
guardrail windows. Used by ``gpuops.store.sql`` (the queries both backends run) and by the API
at its edge. These documents are the I/O edge: nothing outside a codec, a row or the API hands
one on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from sys import intern
from typing import Any

from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import freeze
from gpuops.model.evaluation.state import Status, TargetState
from gpuops.model.guardrails import Execution, GuardrailState
from gpuops.model.records import (
    decision_doc,
    decision_from_doc,
    outcome_doc,
    outcome_from_doc,
)
from gpuops.store.interface import (
    Approval,
    ApprovalStatus,
    Audited,
    DecisionStatus,
    QuotaRequest,
    QuotaStatus,
    StoredDecision,
)


def stored_decision_doc(stored: StoredDecision) -> dict[str, Any]:
    """A stored decision as the API serves it: the decision's JSON form plus ``status``,
    ``outcome`` and, once retried, ``retried_at``."""
    doc = decision_doc(stored.decision)
    doc["status"] = stored.status.value
    doc["outcome"] = None if stored.outcome is None else outcome_doc(stored.outcome)
    if stored.retried_at is not None:
        doc["retried_at"] = stored.retried_at
    return doc


def stored_decision_from_doc(
    doc: Mapping[str, Any], audited: Audited = Audited.NOTHING
) -> StoredDecision:
    """The inverse of ``stored_decision_doc`` (``audited`` is the backend's column)."""
    outcome = doc.get("outcome")
    return StoredDecision(
        decision_from_doc(doc),
        DecisionStatus(doc["status"]),
        None if outcome is None else outcome_from_doc(outcome),
        audited,
        doc.get("retried_at"),
    )


def approval_doc(approval: Approval) -> dict[str, Any]:
    """The JSON form the API serves (``decision`` is the decision's JSON form)."""
    return {
        "decision_id": approval.decision_id,
        "policy": approval.policy,
        "target": approval.target,
        "requested_at": approval.requested_at,
        "expires_at": approval.expires_at,
        "status": approval.status.value,
        "decided_by": approval.decided_by,
        "decided_at": approval.decided_at,
        "decision": decision_doc(approval.decision),
    }


def approval_from_doc(doc: Mapping[str, Any]) -> Approval:
    return Approval(
        decision_from_doc(doc["decision"]),
        float(doc["requested_at"]),
        float(doc["expires_at"]),
        ApprovalStatus(doc["status"]),
        doc.get("decided_by"),
        doc.get("decided_at"),
    )


_QUOTA_FIELDS = frozenset(f.name for f in fields(QuotaRequest))


def quota_request_doc(request: QuotaRequest) -> dict[str, Any]:
    """The JSON form of a quota request (stored and served by the API)."""
    doc = asdict(request)
    doc["status"] = request.status.value
    return doc


def quota_request_from_doc(doc: Mapping[str, Any]) -> QuotaRequest:
    """The inverse of ``quota_request_doc``; a field this version does not know is an error
    (a newer engine's row), a missing one takes its default (an older one's)."""
    unknown = set(doc) - _QUOTA_FIELDS
    if unknown:
        raise ValueError(f"unknown quota request fields: {', '.join(sorted(unknown))}")
    values = dict(doc)
    values["status"] = QuotaStatus(values.get("status", QuotaStatus.PENDING.value))
    return QuotaRequest(**values)


def alert_doc(alert: Alert) -> dict[str, Any]:
    """An Alertmanager alert as stored: the webhook's own JSON form of it (its keys, in the
    order Alertmanager sends them)."""
    return {
        "status": alert.status.value,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": alert.starts_at,
        "endsAt": alert.ends_at,
        "generatorURL": alert.generator_url,
        "fingerprint": alert.fingerprint,
    }


def alert_from_doc(doc: Mapping[str, Any], *, unknown_status_resolved: bool = False) -> Alert:
    """The inverse of ``alert_doc``, which older engines' rows read with too: a key a row
    lacks takes the value the inbox has always given it (firing, no labels, empty text), and a
    key Alertmanager adds is ignored. ``ValueError``: not a JSON object, labels or annotations
    that are not one, or a status other than firing or resolved — unless
    ``unknown_status_resolved``: then such a status reads as resolved, as the inbox has always
    handled it (whatever is not firing runs the policies' ``on_clear``; ``alert_status_problem``
    says so)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"an alert is a JSON object, not {type(doc).__name__}")
    problem = alert_status_problem(doc)
    if problem is not None and not unknown_status_resolved:
        raise ValueError(problem)
    return Alert(
        fingerprint=str(doc.get("fingerprint", "")),
        status=AlertStatus.RESOLVED
        if problem is not None
        else AlertStatus(doc.get("status", AlertStatus.FIRING.value)),
        labels=_texts(doc.get("labels"), "labels"),
        annotations=_texts(doc.get("annotations"), "annotations"),
        starts_at=str(doc.get("startsAt", "")),
        ends_at=str(doc.get("endsAt", "")),
        generator_url=str(doc.get("generatorURL", "")),
    )


def alert_status_problem(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with a stored alert's ``status`` (None: firing, resolved, or none, which
    reads as firing)."""
    status = doc.get("status", AlertStatus.FIRING.value)
    if status in (AlertStatus.FIRING.value, AlertStatus.RESOLVED.value):
        return None
    return f"status {status!r} is neither firing nor resolved"


def _texts(doc: Mapping[str, Any] | None, key: str) -> Mapping[str, str]:
    """A read-only mapping of text to text (labels, annotations)."""
    if doc is not None and not isinstance(doc, Mapping):
        raise ValueError(f"{key} is a JSON object, not {type(doc).__name__}")
    return freeze({str(k): str(v) for k, v in (doc or {}).items()})


def target_state_doc(t: TargetState) -> dict[str, Any]:
    """A policy's target as its ``policy_targets`` row holds it (``TargetState``'s fields, in
    their order: ``gpuops.store.sql.columns`` writes the same keys)."""
    return {
        "status": t.status.value,
        "active_since": t.active_since,
        "last_seen": t.last_seen,
        "value": t.value,
        "labels": dict(t.labels),
        "fired_at": t.fired_at,
        "last_fire_at": t.last_fire_at,
        "repeats": t.repeats,
        "absent_since": t.absent_since,
        "actions": t.actions,
        "retry_at": t.retry_at,
        "held": t.held,
        "held_since": t.held_since,
        "held_repeats": t.held_repeats,
    }


def _interned(labels: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``freeze(labels)`` with its string values interned (``Target.from_labels``)."""
    frozen = freeze(labels)
    return freeze({k: intern(v) if type(v) is str else v for k, v in frozen.items()})


def target_state_from_doc(t: Mapping[str, Any]) -> TargetState:
    """The inverse of ``target_state_doc``; the fields added after the first version take
    their defaults when a row lacks them."""
    return TargetState(
        status=Status(t["status"]),
        active_since=t["active_since"],
        last_seen=t["last_seen"],
        value=t["value"],
        labels=_interned(t["labels"]),
        fired_at=t["fired_at"],
        last_fire_at=t["last_fire_at"],
        repeats=t["repeats"],
        absent_since=t.get("absent_since"),
        actions=int(t.get("actions", 0)),
        retry_at=t.get("retry_at"),
        held=t.get("held"),
        held_since=t.get("held_since"),
        held_repeats=int(t.get("held_repeats", 0)),
    )


def guardrail_state_doc(state: GuardrailState) -> dict[str, Any]:
    """The guardrail windows as their one ``guardrails`` row holds them."""
    return {
        "last_action": dict(state.last_action),
        "recent": [{"at": e.at, "policy": e.policy, "target": e.target} for e in state.recent],
    }


def guardrail_state_from_doc(doc: Mapping[str, Any]) -> GuardrailState:
    """The inverse of ``guardrail_state_doc`` (``KeyError``, ``TypeError`` or
    ``AttributeError`` when the document is not one)."""
    return GuardrailState(
        freeze(doc["last_action"]),
        tuple(Execution(e["at"], e["policy"], e["target"]) for e in doc["recent"]),
    )
