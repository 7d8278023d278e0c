"""One codec per stored type, each round-tripped: what goes into the state file comes back equal
(policy and guardrail states, decisions, outcomes, approvals, quota requests, alerts)."""

from __future__ import annotations

import json
import logging
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Suppression,
    Target,
    Transition,
    Verdict,
    freeze,
)
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.guardrails import Execution, GuardrailState
from gpuops.model.records import decision_doc, decision_from_doc, outcome_doc, outcome_from_doc
from gpuops.store.codecs import (
    alert_doc,
    alert_from_doc,
    alert_status_problem,
    approval_doc,
    approval_from_doc,
    guardrail_state_doc,
    guardrail_state_from_doc,
    quota_request_doc,
    quota_request_from_doc,
    stored_decision_doc,
    stored_decision_from_doc,
    target_state_doc,
    target_state_from_doc,
)
from gpuops.store.interface import (
    AlertKey,
    Approval,
    ApprovalStatus,
    Audited,
    DecisionStatus,
    InboxItem,
    QuotaRequest,
    QuotaStatus,
    StoredDecision,
)
from gpuops.store.sqlite import StateStore

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


def test_target_state_and_guardrail_codecs_round_trip_through_json() -> None:
    target = TargetState(
        Status.FIRING,
        active_since=1.0,
        last_seen=2.0,
        value=0.1,
        labels=freeze({"uuid": "a"}),
        fired_at=1.5,
        held="suppressed:max_fraction",
        held_since=1.6,
        held_repeats=2,
    )
    doc = json.loads(json.dumps(target_state_doc(target)))
    assert list(doc) == [f.name for f in fields(TargetState)]
    assert target_state_from_doc(doc) == target
    old = {k: v for k, v in doc.items() if k not in ("actions", "retry_at", "held_repeats")}
    assert target_state_from_doc(old) == replace(target, held_repeats=0)
    guard = GuardrailState(freeze({"p\x1fuuid=a": 5.0}), (Execution(5.0, "p", "uuid=a"),))
    assert guardrail_state_from_doc(json.loads(json.dumps(guardrail_state_doc(guard)))) == guard


def test_decision_round_trips_through_the_state_file(store: StateStore) -> None:
    assert decision_from_doc(decision_doc(DECISION)) == DECISION
    with store.transaction() as db:
        assert store.record_decision(db, DECISION, DecisionStatus.STARTED)
        assert not store.record_decision(db, DECISION, DecisionStatus.STARTED)  # a replay
    assert store.decision("d1") == StoredDecision(DECISION, DecisionStatus.STARTED)
    store.mark_audited(["d1"], Audited.INTENT)
    assert store.unfinished() == [StoredDecision(DECISION, DecisionStatus.STARTED, None, 1)]


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
        store.record_decision(db, DECISION, DecisionStatus.STARTED)
    held = DECISION.with_verdict("dry_run", "engine is in dry-run")
    store.finish_decision("d1", outcome, held)
    assert store.decision("d1") == StoredDecision(held, DecisionStatus.DONE, outcome)


def test_stored_decision_codec_round_trips() -> None:
    outcome = Outcome(OutcomeStatus.FAILURE, 2, 1.5, "503", permanent=False)
    stored = StoredDecision(DECISION, DecisionStatus.DONE, outcome, Audited.OUTCOME, 7.0)
    doc = stored_decision_doc(stored)
    assert doc["status"] == "done" and doc["outcome"]["error"] == "503"
    assert stored_decision_from_doc(doc, Audited.OUTCOME) == stored
    assert json.loads(json.dumps(doc)) == doc  # plain JSON


def test_approval_round_trips(store: StateStore) -> None:
    waiting = DECISION.with_verdict("awaiting_approval", "approval required")
    with store.transaction() as db:
        store.save_approval(db, waiting, 10.0, 20.0)
    pending = Approval(waiting, 10.0, 20.0)
    assert store.approval("d1") == pending
    assert approval_from_doc(approval_doc(pending)) == pending
    with store.transaction() as db:
        granted = store.settle_approval(db, "d1", ApprovalStatus.GRANTED, "alice", 15.0)
        again = store.settle_approval(db, "d1", ApprovalStatus.DENIED, "bob", 16.0)
    assert granted == Approval(waiting, 10.0, 20.0, ApprovalStatus.GRANTED, "alice", 15.0)
    assert again is None  # settled once
    assert store.approvals(ApprovalStatus.GRANTED) == [granted]
    assert approval_from_doc(approval_doc(granted)) == granted


QUOTA = QuotaRequest(
    id="q1",
    project="vision",
    gpus=8,
    duration_s=3600.0,
    reason="deadline",
    requested_by="dave",
    requested_at=1.0,
    expires_at=2.0,
    status=QuotaStatus.RELEASING,
    nodes=1,
    decided_by="alice",
    decided_at=1.5,
    starts_at=1.5,
    ends_at=3601.5,
    grant_decision="d1",
    error="suppressed:kill_switch: the kill switch is on",
    release_attempts=2,
    apply_attempts=1,
)


def test_quota_request_round_trips(store: StateStore) -> None:
    assert quota_request_from_doc(quota_request_doc(QUOTA)) == QUOTA
    store.add_quota_request(QUOTA)
    assert store.quota_request("q1") == QUOTA
    ended = replace(QUOTA, status=QuotaStatus.ENDED)
    assert store.move_quota_request(ended, QuotaStatus.RELEASING)
    assert not store.move_quota_request(ended, QuotaStatus.RELEASING)  # compare and set
    assert store.quota_requests(QuotaStatus.ENDED) == [ended]


def test_a_quota_request_of_an_older_version_reads_with_defaults() -> None:
    doc = quota_request_doc(QUOTA)
    del doc["apply_attempts"]
    assert quota_request_from_doc(doc) == replace(QUOTA, apply_attempts=0)
    with pytest.raises(ValueError, match="unknown quota request fields: colour"):
        quota_request_from_doc({**doc, "colour": "red"})


def test_inbox_alerts_and_early_resolves_round_trip(store: StateStore) -> None:
    labels = freeze({"alertname": "X", "node": "n/1"})
    alert = Alert("fp", AlertStatus.FIRING, labels, starts_at="t")
    (item,) = store.inbox_add([alert], 5.0)
    assert store.inbox() == [InboxItem(item, alert, 5.0)]
    assert alert_from_doc(alert_doc(alert)) == alert
    key = AlertKey("fp", "t", "firing")
    assert not store.alert_known(key) and not store.seen_alert(key, 6.0)
    assert store.alert_known(key) and store.seen_alert(key, 7.0)  # a retried webhook
    store.forget_alert(key)
    assert not store.alert_known(key)
    resolved = replace(alert, status=AlertStatus.RESOLVED)
    store.save_early_resolve("f1", resolved, 8.0)
    assert store.take_early_resolve("f1") == resolved
    assert store.take_early_resolve("f1") is None  # handled once


def test_verdicts_travel_as_enums_and_render_as_the_same_text() -> None:
    """Verdicts are ``Verdict`` members inside the engine; the state file, the API's JSON and
    the audit documents keep the text they always had."""
    assert [s.verdict.value for s in Suppression][:3] == [
        "suppressed:kill_switch",
        "suppressed:paused",
        "suppressed:cooldown",
    ]
    assert all(s.verdict.suppression is s for s in Suppression)
    assert (
        Verdict.EXECUTE.suppression is None
        and not DECISION.with_verdict(Verdict.DRY_RUN, "").suppressed
    )
    assert Suppression.of("suppressed:cooldown") is Suppression.COOLDOWN
    assert Suppression.of("suppressed:nonsense") is None and Suppression.of("execute") is None
    doc = decision_doc(DECISION)
    assert doc["verdict"] == "suppressed:kill_switch" and type(doc["verdict"]) is str
    back = decision_from_doc(doc)
    assert back.verdict is Verdict.SUPPRESSED_KILL_SWITCH and back.suppressed
    with pytest.raises(ValueError):
        decision_from_doc({**doc, "verdict": "suppressed:typo"})


def test_an_alert_status_neither_firing_nor_resolved_reads_as_resolved_when_asked() -> None:
    """The inbox handles such a row as resolved (as it always did); read strictly it is an
    error, which ``gpuops state check`` reports."""
    doc = {"status": "pending", "labels": {"alertname": "X"}, "fingerprint": "a"}
    with pytest.raises(ValueError, match="status 'pending' is neither firing nor resolved"):
        alert_from_doc(doc)
    assert alert_from_doc(doc, unknown_status_resolved=True) == Alert(
        "a", AlertStatus.RESOLVED, freeze({"alertname": "X"})
    )
    assert alert_status_problem(doc) == "status 'pending' is neither firing nor resolved"
    assert alert_status_problem({"labels": {}}) is None  # an older row: firing
    assert alert_from_doc({}).status is AlertStatus.FIRING


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], "an alert is a JSON object, not list"),
        ({"labels": ["a"]}, "labels is a JSON object, not list"),
        ({"annotations": "x"}, "annotations is a JSON object, not str"),
    ],
)
def test_an_alert_that_is_not_one_is_a_value_error(doc: Any, message: str) -> None:
    for lenient in (False, True):
        with pytest.raises(ValueError, match=message):
            alert_from_doc(doc, unknown_status_resolved=lenient)


def test_the_inbox_reads_past_a_bad_row_and_logs_it(
    store: StateStore, caplog: pytest.LogCaptureFixture
) -> None:
    good = Alert("fp", AlertStatus.FIRING, freeze({"alertname": "X"}), starts_at="t")
    with store.transaction() as db:
        db.execute(
            "INSERT INTO alert_inbox (received_at, alert) VALUES (1, ?)",
            ('{"status": "pending", "fingerprint": "odd"}',),
        )
        db.execute("INSERT INTO alert_inbox (received_at, alert) VALUES (2, '[')")
    (item,) = store.inbox_add([good], 3.0)
    with caplog.at_level(logging.WARNING, logger="gpuops.store.sql.alerts"):
        items = store.inbox()
    assert items == [
        InboxItem(1, Alert("odd", AlertStatus.RESOLVED, freeze({})), 1.0),
        InboxItem(item, good, 3.0),
    ]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            f"{store.path}: alert_inbox row 1: status 'pending' is neither firing nor resolved;"
            ' handled as resolved: {"status": "pending", "fingerprint": "odd"}',
        ),
        (
            "ERROR",
            f"{store.path}: alert_inbox row 2 cannot be decoded (JSONDecodeError: Expecting"
            " value: line 1 column 2 (char 1)), left as it is (gpuops state check reports it): [",
        ),
    ]
    assert store.alert_row_problems() == [
        f"{store.path}: alert_inbox row 1: status 'pending' is neither firing nor resolved:"
        " the engine handles it as resolved",
        f"{store.path}: alert_inbox row 2 cannot be decoded (JSONDecodeError: Expecting value:"
        " line 1 column 2 (char 1); it starts '['): the engine leaves it in the inbox",
    ]


def test_an_early_resolve_that_cannot_be_decoded_stays_and_reads_as_none(
    store: StateStore,
) -> None:
    with store.transaction() as db:
        db.execute("INSERT INTO early_resolves VALUES ('f1', '{\"labels\": 3}', 1)")
        db.execute(
            "INSERT INTO early_resolves VALUES ('f2', ?, 1)",
            ('{"status": "gone", "fingerprint": "x"}',),
        )
    assert store.take_early_resolve("f1") is None
    assert store.take_early_resolve("f2") == Alert("x", AlertStatus.RESOLVED, freeze({}))
    assert store.alert_row_problems() == [
        f"{store.path}: early_resolves row f1 cannot be decoded (ValueError: labels is a JSON"
        " object, not int; it starts '{\"labels\": 3}'): the engine never handles it"
    ]
    assert store.prune_alert_episodes(2.0) == 1  # the prune of old episodes removes it
    assert store.alert_row_problems() == []
