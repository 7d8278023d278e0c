"""The API's answers (``gpuops.api.responses``) are the JSON forms the state store keeps, key for
key and number for number (an int stays an int). The served OpenAPI spec:
tests/integration/api/test_spec.py."""

from __future__ import annotations

import json
from dataclasses import fields
from types import MappingProxyType
from typing import Any

from gpuops.api.responses.decisions import ApprovalWithDecisionOut, DecisionOut, StoredDecisionOut
from gpuops.api.responses.quota import QuotaRequestOut
from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
    Verdict,
)
from gpuops.model.records import decision_doc
from gpuops.store.codecs import approval_doc, quota_request_doc, stored_decision_doc
from gpuops.store.interface import (
    Approval,
    ApprovalStatus,
    DecisionStatus,
    QuotaRequest,
    QuotaStatus,
    StoredDecision,
)

DECISION = Decision(
    id="d1",
    policy="reclaim",
    group="g",
    target=Target("node=n1", MappingProxyType({"node": "n1"})),
    transition=Transition.FIRE,
    action=ActionSpec(
        "reclaim", "log", MappingProxyType({"n": 3, "f": 0.5, "nested": MappingProxyType({})})
    ),
    evidence=Evidence("up == 0", 1, None, 1000),
    at=1000,
    episode_start=990.5,
    verdict=Verdict.AWAITING_APPROVAL,
    labels=MappingProxyType({"team": "a"}),
)


def _wire(value: Any) -> str:
    """JSON as served, keys sorted: 1 and 1.0 differ."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return json.dumps(value, sort_keys=True)


def test_a_decision_is_its_stored_json_form() -> None:
    assert _wire(DecisionOut.of(DECISION)) == _wire(decision_doc(DECISION))
    outcome = Outcome(OutcomeStatus.FAILURE, 3, 0.25, "refused", MappingProxyType({"a": [1]}))
    for stored in (
        StoredDecision(DECISION, DecisionStatus.STARTED),
        StoredDecision(DECISION, DecisionStatus.DONE, outcome, retried_at=1200),
    ):
        assert _wire(StoredDecisionOut.stored(stored)) == _wire(stored_decision_doc(stored))


def test_an_approval_is_its_stored_json_form() -> None:
    for approval in (
        Approval(DECISION, 1000, 4600.5),
        Approval(DECISION, 1000, 4600, ApprovalStatus.DENIED, "alice", 1100),
    ):
        assert _wire(ApprovalWithDecisionOut.with_decision(approval)) == _wire(
            approval_doc(approval)
        )


def test_a_quota_request_serves_every_field_it_stores() -> None:
    assert set(QuotaRequestOut.model_fields) == {f.name for f in fields(QuotaRequest)}
    request = QuotaRequest("q1", "nlp", 3, 7200, "", "dave", 1000, 4600, QuotaStatus.ACTIVE)
    assert _wire(QuotaRequestOut.of(request)) == _wire(quota_request_doc(request))
