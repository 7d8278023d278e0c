"""One codec per stored type, each round-tripped: what goes into the state file comes back equal
(policy and guardrail states, decisions, outcomes, quota requests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Suppression,
    Target,
    Transition,
    freeze,
)
from engine.evaluation import PolicyState, Status, TargetState
from engine.guardrails import Execution, GuardrailState
from engine.records import decision_doc, decision_from_doc, outcome_doc, outcome_from_doc
from engine.runtime.quota import QuotaRequest, QuotaStore
from engine.state import StateStore

DECISION = Decision(
    id="d1",
    policy="reclaim",
    group="g",
    target=Target("node=n,uuid=u", freeze({"node": "n", "uuid": "u"})),
    transition=Transition.FIRE,
    action=ActionSpec("reclaim", "fleet", freeze({"nodes": 2, "nested": {"a": [1, 2]}})),
    evidence=Evidence("util < 0.2", 0.05, 100.0, 160.0),
    at=160.0,
    episode_start=100.0,
    repeat=3,
    verdict="suppressed:kill_switch",
    reason="held at the gate: the kill switch is on",
    mode="enforce",
    labels=freeze({"team": "ml"}),
    annotations=freeze({"summary": "idle"}),
)


@pytest.fixture
def store(tmp_path: Path):  # noqa: ANN201
    s = StateStore(tmp_path / "state.sqlite")
    yield s
    s.close()


def test_policy_state_round_trips(store: StateStore) -> None:
    state = PolicyState(
        freeze(
            {
                "uuid=a": TargetState(
                    Status.FIRING,
                    active_since=1.0,
                    last_seen=2.0,
                    value=0.1,
                    labels=freeze({"uuid": "a"}),
                    fired_at=1.5,
                    last_fire_at=1.75,
                    repeats=2,
                    absent_since=None,
                    actions=1,
                    retry_at=99.0,
                ),
                "uuid=b": TargetState(Status.PENDING, 3.0, 3.0, None, freeze({"uuid": "b"})),
            }
        )
    )
    with store.transaction() as db:
        store.save_policy_state(db, "p", state)
    assert store.policy_state("p") == state


def test_guardrail_state_round_trips(store: StateStore) -> None:
    state = GuardrailState(
        freeze({"p\x1fuuid=a": 5.0}), (Execution(5.0, "p", "uuid=a"), Execution(6.0, "q", "x"))
    )
    with store.transaction() as db:
        store.save_guardrail_state(db, state)
    assert store.guardrail_state() == state


def test_decision_round_trips_through_the_state_file(store: StateStore) -> None:
    assert decision_from_doc(decision_doc(DECISION)) == DECISION
    with store.transaction() as db:
        assert store.record_decision(db, decision_doc(DECISION), "started")
        assert not store.record_decision(db, decision_doc(DECISION), "started")  # a replay
    stored = store.decision("d1")
    assert stored is not None and decision_from_doc(stored) == DECISION


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(OutcomeStatus.SUCCESS, 1, 0.25, None, freeze({"clock": 1100})),
        Outcome(OutcomeStatus.FAILURE, 3, 2.0, "fleet answered 404", permanent=True),
        Outcome(OutcomeStatus.SKIPPED, error="held at the gate: paused"),
    ],
)
def test_outcome_round_trips(store: StateStore, outcome: Outcome) -> None:
    assert outcome_from_doc(outcome_doc(outcome)) == outcome
    with store.transaction() as db:
        store.record_decision(db, decision_doc(DECISION), "started")
    store.finish_decision("d1", outcome_doc(outcome), "dry_run", "engine is in dry-run")
    stored = store.decision("d1")
    assert stored is not None and outcome_from_doc(stored["outcome"]) == outcome
    assert decision_from_doc(stored).verdict == "dry_run"
    assert decision_from_doc(stored).reason == "engine is in dry-run"


def test_quota_request_round_trips(tmp_path: Path) -> None:
    quotas = QuotaStore(tmp_path / "state.sqlite")
    request = QuotaRequest(
        id="q1",
        project="vision",
        gpus=8,
        duration_s=3600.0,
        reason="deadline",
        requested_by="dave",
        requested_at=1.0,
        expires_at=2.0,
        status="releasing",
        nodes=1,
        decided_by="alice",
        decided_at=1.5,
        starts_at=1.5,
        ends_at=3601.5,
        grant_decision="d1",
        error="suppressed:kill_switch: the kill switch is on",
        release_attempts=2,
    )
    quotas.add(request)
    assert quotas.get("q1") == request
    quotas.close()


@pytest.mark.parametrize("reason", list(Suppression))
def test_suppressions_round_trip_through_their_verdict_text(reason: Suppression) -> None:
    assert Suppression.of(reason.verdict) is reason


@pytest.mark.parametrize("verdict", ["execute", "dry_run", "suppressed:", "suppressed:unknown"])
def test_other_verdicts_are_no_suppression(verdict: str) -> None:
    assert Suppression.of(verdict) is None
