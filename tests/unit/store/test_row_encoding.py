"""The state file's rows written with orjson (a row is written for every changed target and
every decision of an evaluation): the same keys in the same order and the same values read back
as ``json.dumps`` gives; NaN, Infinity and what orjson refuses fall back to ``json.dumps``
(orjson writes NaN as null)."""

from __future__ import annotations

import datetime
import json
import math
import uuid
from pathlib import Path

import pytest

from gpuops.model.decisions import ActionSpec, Decision, Evidence, Target, Transition, freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.records import decision_doc, decision_from_doc
from gpuops.store.codecs import target_state_doc as _target_state_to_dict
from gpuops.store.interface import DecisionStatus
from gpuops.store.sql.columns import decision_data as _decision_data
from gpuops.store.sql.columns import target_data as _target_data
from gpuops.store.sqlite import StateStore

NAN, INF = float("nan"), float("inf")


def a_target(**changes: object) -> TargetState:
    labels = freeze({"node": "n-0001", "uuid": 'GPU-é\u2028"x"', "gpu": "3"})
    fields: dict[str, object] = {
        "status": Status.FIRING,
        "active_since": 1.7e9,
        "last_seen": 1.7e9 + 30.5,
        "value": 0.1 + 1e-17,
        "labels": labels,
        "fired_at": 1.7e9 + 60,
        "last_fire_at": 1.7e9 + 60,
        "repeats": 2,
        "retry_at": 1.7e9 + 90,
        "held": "suppressed:global_budget",
        "held_since": 1.7e9 + 61,
        "held_repeats": 3,
        "actions": 1,
    }
    fields.update(changes)
    return TargetState(**fields)  # type: ignore[arg-type]


def a_decision(value: float | None = 0.3, params: object = None) -> Decision:
    action = ActionSpec("reclaim", "noop", freeze({"grace_s": 30, "why": params}))
    return Decision(
        id="d-1",
        policy="reclaim-idle-gpus",
        group="g",
        target=Target("node=n-1,uuid=GPU-1", freeze({"node": "n-1", "uuid": "GPU-1"})),
        transition=Transition.FIRE,
        action=action,
        evidence=Evidence("avg_over_time(x[5m]) < 0.05", value, 1.7e9, 1.7e9 + 60.25),
        at=1.7e9 + 60.25,
        episode_start=1.7e9,
        labels=freeze({"team": "ml"}),
        annotations=freeze({"summary": "idle ✓"}),
    )


def same(text: str, expected: object) -> bool:
    """``text`` reads back as ``expected`` (NaN equal to NaN), keys in the same order."""
    got = json.loads(text)
    return json.dumps(got) == json.dumps(expected)


def test_a_target_row_has_the_dicts_keys_in_order_and_its_values() -> None:
    for t in (a_target(), a_target(value=None, fired_at=None, labels=freeze({}))):
        text = _target_data(t)
        assert same(text, _target_state_to_dict(t))
        assert list(json.loads(text)) == list(_target_state_to_dict(t))
        assert " " not in text.replace(json.dumps(dict(t.labels))[1:-1], "")  # compact: orjson


@pytest.mark.parametrize("change", [{"value": NAN}, {"value": INF}, {"retry_at": -INF}])
def test_a_target_with_nan_or_infinity_is_written_by_json_dumps(change: dict[str, float]) -> None:
    t = a_target(**change)
    text = _target_data(t)
    assert text == json.dumps(_target_state_to_dict(t))
    ((field, value),) = change.items()
    back = json.loads(text)[field]
    assert math.isnan(back) if math.isnan(value) else back == value


def test_a_decision_row_reads_back_as_its_document() -> None:
    d = a_decision()
    assert same(_decision_data(d), decision_doc(d))
    assert decision_from_doc(json.loads(_decision_data(d))) == d
    for nan in (a_decision(value=NAN), a_decision(params=[1, {"x": INF}])):
        assert _decision_data(nan) == json.dumps(decision_doc(nan))
    big = a_decision(params=2**70)  # beyond orjson's integers
    assert _decision_data(big) == json.dumps(decision_doc(big))


def test_a_decision_whose_params_json_cannot_write_is_refused_as_before() -> None:
    """orjson writes dates, datetimes and UUIDs (a YAML ``until: 2024-01-01`` is a date),
    json.dumps refuses them: recorded with a string where the live run had a date, a recovery
    after a crash would hand its executor other params than the live run's. Such a decision
    raises, as with json.dumps (nothing recorded, nothing run)."""
    odd = (datetime.date(2024, 1, 1), datetime.datetime(2024, 1, 1, 2, 3), uuid.UUID(int=1))
    for value in odd:
        with pytest.raises(TypeError):
            _decision_data(a_decision(params=value))
        with pytest.raises(TypeError):
            _decision_data(a_decision(params=[1, {"x": value}]))


def test_rows_written_by_orjson_read_back_through_the_store(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    try:
        targets = {"a": a_target(), "b": a_target(value=NAN)}
        with store.transaction() as db:
            store.save_policy_state(db, "p", PolicyState(freeze(targets)))
            assert store.record_decision(db, a_decision(), DecisionStatus.STARTED)
        store.close()
        store = StateStore(tmp_path / "state.sqlite")
        back = store.policy_state("p").targets
        assert back["a"] == targets["a"]
        assert math.isnan(back["b"].value or 0.0)
        (stored,) = store.decisions(limit=5)
        assert stored.decision == a_decision()
    finally:
        store.close()


def test_record_decisions_inserts_each_id_once_and_says_which(tmp_path: Path) -> None:
    """One statement for a round's decisions, as one ``record_decision`` each would be: a
    replay (stored before) and an id repeated in the batch are not inserted again."""
    store = StateStore(tmp_path / "state.sqlite")
    try:
        old, new = a_decision(), a_decision().but(id="d-2", reason="second")
        again = new.but(reason="the same id again")
        with store.transaction() as db:
            assert store.record_decision(db, old, DecisionStatus.DONE)
        with store.transaction() as db:
            batch = [(old, DecisionStatus.STARTED), (new, DecisionStatus.STARTED)]
            assert store.record_decisions(db, [*batch, (again, DecisionStatus.DONE)]) == {"d-2"}
            assert store.record_decisions(db, batch) == set()
        stored = {s.decision.id: s for s in store.decisions(limit=5)}
        assert stored["d-1"].decision == old and stored["d-1"].status is DecisionStatus.DONE
        assert stored["d-2"].decision == new and stored["d-2"].status is DecisionStatus.STARTED
    finally:
        store.close()
