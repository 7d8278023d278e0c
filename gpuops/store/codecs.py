"""One JSON codec per stored type (``gpuops.store.interface``'s values): what a backend writes into
its
JSON columns and the API serves, and the inverse. Each pair round-trips
(``tests/unit/engine/test_codecs.py``).

Decisions and outcomes use ``gpuops.model.records``' forms; this module adds the aggregates of the
store. Used by ``gpuops.store.sqlite`` (and any other backend) and by the API at its edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from gpuops.model.decisions import freeze
from gpuops.model.records import (
    decision_doc,
    decision_from_doc,
    outcome_doc,
    outcome_from_doc,
    plain,
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
    """A stored decision as the API serves it: the decision's JSON form plus ``status`` and
    ``outcome`` (as before the store was typed)."""
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


def alert_doc(alert: Mapping[str, Any]) -> dict[str, Any]:
    """An Alertmanager alert as stored (plain JSON)."""
    return {str(k): plain(v) for k, v in alert.items()}


def alert_from_doc(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only alert (its nested ``labels``/``annotations`` too)."""
    return freeze({k: freeze(v) if isinstance(v, Mapping) else v for k, v in doc.items()})
