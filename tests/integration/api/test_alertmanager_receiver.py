"""``POST /api/v1/alertmanager``: v4 payloads queued and answered at once, deduped by
(fingerprint, startsAt, status) across restarts; firing → action, resolved → on_clear."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuops.model.alerts import Alert, AlertStatus
from gpuops.store.errors import StateError
from gpuops.store.sqlite import StateStore
from tests.integration.api.harness import Harness, running_api

POLICY = "drain-on-gpu-fell-off-bus"


def test_firing_alert_runs_the_action_once_however_often_delivered(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    alert = api.alert("GPUFellOffBus", node="n1", severity="critical")
    handling = threading.Event()
    handle = api.context.alerts._handle_batch

    def held(batch: Sequence[tuple[int, Alert]]) -> None:
        handling.wait(30)
        handle(batch)

    monkeypatch.setattr(api.context.alerts, "_handle_batch", held)
    resp = api.notify(alert)
    assert resp.json() == {"queued": 1}
    assert api.executed(POLICY) == [], "answered once queued, before it is handled"
    handling.set()
    for _ in range(3):
        assert api.notify(alert).status_code == 200
    api.settle()
    [outcome] = api.executed(POLICY)
    assert outcome.ok
    [decision] = [d for d, o in api.decisions if o is not None]
    assert decision.target.key == "node=n1" and decision.action is not None
    assert decision.action.type == "migrate"
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_api_alerts_total{result="duplicate"} 3.0' in metrics


def test_resolved_alert_runs_on_clear_as_a_resolve(api: Harness) -> None:
    alert = api.alert("GPUFellOffBus", node="n1")
    api.notify(alert)
    api.notify({**alert, "status": "resolved", "endsAt": "2030-01-01T00:05:00Z"})
    api.settle()
    done = [
        (d.transition.value, d.action.type if d.action else None) for d, o in api.decisions if o
    ]
    assert done == [("fire", "migrate"), ("resolve", "notify")]


def test_alert_matching_no_policy_does_nothing(api: Harness) -> None:
    api.notify(api.alert("SomethingElse", node="n1"))
    api.settle()
    assert api.decisions == []


def test_dedupe_survives_a_restart(tmp_path: Path) -> None:
    with running_api(tmp_path) as first:
        alert = first.alert("GPUFellOffBus", node="n1")
        first.notify(alert)
        first.settle()
        assert len(first.executed(POLICY)) == 1
    with running_api(tmp_path) as second:
        assert second.notify(alert).status_code == 200
        second.settle()
        assert second.executed(POLICY) == []
        assert second.decisions == []


def test_invalid_payloads_are_422_with_the_reason(api: Harness) -> None:
    v3 = api.call("alertmanager", "POST", "/api/v1/alertmanager", json={"version": "3"})
    assert v3.status_code == 422
    assert "body.version: Input should be '4'" in v3.json()["detail"]
    no_fp = {k: v for k, v in api.alert("X").items() if k != "fingerprint"}
    missing = api.notify(no_fp)
    assert missing.status_code == 422 and "fingerprint: Field required" in missing.json()["detail"]


def _no_room(waiting: int, size: int, alerts: int, when: str) -> dict[str, str]:
    return {
        "detail": f"the alert queue holds {waiting} alerts (api.alert_queue_size {size}):"
        f" no room for this notification of {alerts} now, taken {when}; Alertmanager will retry"
    }


@pytest.mark.parametrize("group", [10_000, 10_001])
def test_a_group_larger_than_the_queue_is_taken_whole_when_none_waits(
    tmp_path: Path, group: int
) -> None:
    """Alertmanager retries only 5xx: a group the body limit lets through is never refused
    for its size (a 422 would drop it), only answered 503 while others wait."""
    with running_api(tmp_path) as api:
        size = api.context.settings.alert_queue_size
        assert size == 10_000
        api.engine.alerts.stop()  # no worker: what is queued stays queued
        alerts = [api.alert("Unmatched", node=f"n{i}") for i in range(group)]
        resp = api.notify(*alerts)
        assert (resp.status_code, resp.json()) == (200, {"queued": group})
        late = api.notify(api.alert("GPUFellOffBus", node="late"))
        assert late.status_code == 503
        assert late.json() == _no_room(group, size, 1, "once enough of them are handled")
        assert len(api.engine.store.inbox()) == group


def test_a_group_with_no_room_behind_the_waiting_ones_is_503_until_they_are_handled(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path, api={"alert_queue_size": 5}) as api:
        api.engine.alerts.stop()
        assert api.notify(*[api.alert("GPUFellOffBus", node=f"n{i}") for i in range(3)]).ok
        late = [api.alert("GPUFellOffBus", node=f"late{i}") for i in range(3)]
        refused = api.notify(*late)
        assert refused.status_code == 503
        assert refused.json() == _no_room(3, 5, 3, "once enough of them are handled")
        assert api.notify(*late[:2]).json() == {"queued": 2}  # 5 wait: the queue's size
        large = [api.alert("GPUFellOffBus", node=f"large{i}") for i in range(6)]
        assert api.notify(*large).json() == _no_room(5, 5, 6, "once none waits")
        api.engine.alerts.start()
        api.settle()
        assert api.notify(*large).json() == {"queued": 6}  # Alertmanager's retry
        api.settle()
        assert len(api.executed(POLICY)) == 11
        assert api.engine.store.inbox() == []


def test_a_notification_the_state_database_cannot_store_is_503_with_the_reason(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(alerts: object, now: float) -> list[int]:
        raise StateError("postgresql://db:5432/gpuops: connection refused")

    monkeypatch.setattr(api.engine.store, "inbox_add", unreachable)
    resp = api.notify(api.alert("GPUFellOffBus", node="n1"))
    assert resp.status_code == 503
    assert resp.json() == {
        "detail": "the alert inbox cannot store the notification now: postgresql://db:5432/gpuops:"
        " connection refused; Alertmanager will retry"
    }


def _received(node: str, fingerprint: str) -> Alert:
    """An alert as the receiver hands it to the inbox."""
    return Alert(
        fingerprint=fingerprint,
        status=AlertStatus.FIRING,
        labels={"alertname": "GPUFellOffBus", "node": node},
        starts_at="2030-01-01T00:00:00Z",
    )


def test_alerts_received_but_not_handled_before_a_stop_are_handled_at_start(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    alert = _received("n7", "f00d")
    store.inbox_add([alert], 0.0)  # answered 200, then the engine died
    store.close()
    with running_api(tmp_path) as api:
        api.settle()
        [outcome] = api.executed(POLICY)
        assert outcome.ok
        assert api.engine.store.inbox() == []
        assert api.notify(api.alert("GPUFellOffBus", node="n7")).status_code == 200
        api.settle()
        assert len(api.executed(POLICY)) == 1


def test_a_replica_elected_again_adopts_what_the_shared_inbox_received_meanwhile(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path) as api:
        alert = _received("n8", "beef")
        # received by the replica that led while this one stood by, never handled there
        api.engine.store.inbox_add([alert], 0.0)
        api.settle()
        assert api.executed(POLICY) == [], "nothing adopts it before an election"
        api.engine.alerts.adopt()  # what an election runs (Engine._start_alerts)
        api.engine.alerts.adopt()  # twice: queued once
        api.settle()
        [outcome] = api.executed(POLICY)
        assert outcome.ok
        assert api.engine.store.inbox() == []


def test_an_inbox_larger_than_the_queue_is_adopted_whole_without_blocking(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    store.inbox_add([_received(f"m{i}", f"fp{i}") for i in range(3)], 0.0)
    store.close()
    with running_api(tmp_path, api={"alert_queue_size": 1}) as api:  # room for one at a time
        api.engine.alerts.adopt()  # an election meanwhile: it neither blocks nor queues twice
        api.settle()
        assert len(api.executed(POLICY)) == 3
        assert api.engine.store.inbox() == []


def test_an_inbox_row_of_an_older_engine_loads_and_is_handled(tmp_path: Path) -> None:
    """Rows the receiver wrote before the alert was a value of its own (the webhook's JSON
    item as it came, or the few keys tests and older engines wrote) load as alerts."""
    store = StateStore(tmp_path / "state.sqlite")
    store.close()
    full = {
        "status": "firing",
        "labels": {"alertname": "GPUFellOffBus", "node": "n9"},
        "annotations": {"summary": "gone"},
        "startsAt": "2030-01-01T00:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": "f9",
    }
    few = {"labels": {"alertname": "GPUFellOffBus", "node": "n10"}, "startsAt": "2030-01-01"}
    with sqlite3.connect(tmp_path / "state.sqlite") as db:
        for row in (full, few):
            db.execute(
                "INSERT INTO alert_inbox (received_at, alert) VALUES (?, ?)", (0.0, json.dumps(row))
            )
    db.close()
    store = StateStore(tmp_path / "state.sqlite")
    first, second = (item.alert for item in store.inbox())
    store.close()
    assert first == Alert(
        fingerprint="f9",
        status=AlertStatus.FIRING,
        labels={"alertname": "GPUFellOffBus", "node": "n9"},
        annotations={"summary": "gone"},
        starts_at="2030-01-01T00:00:00Z",
        ends_at="0001-01-01T00:00:00Z",
        generator_url="http://prometheus/graph",
    )
    assert (second.fingerprint, second.status, second.starts_at) == ("", "firing", "2030-01-01")
    with running_api(tmp_path) as api:
        api.settle()
        assert len(api.executed(POLICY)) == 2
        assert api.engine.store.inbox() == []
