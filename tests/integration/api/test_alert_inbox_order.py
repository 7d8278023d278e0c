"""The alert inbox's worker: alerts decided in batches, the smallest notification first, each
alert's own notifications in order, and nothing decided twice — within a batch, and when the
batch's record in the inbox fails after its decisions were stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuops.store.errors import StateError
from gpuops.store.interface import AlertKey
from tests.integration.api.harness import Harness, running_api

DRAIN = "drain-on-gpu-fell-off-bus"
RECLAIM = "reclaim-with-approval"


def stored_in_order(api: Harness) -> list[tuple[str, str, str]]:
    """(policy, target, transition) of every stored decision, oldest first (the harness's
    clock stands still: insertion order)."""
    newest_first = api.engine.store.decisions(limit=100_000)
    return [
        (s.decision.policy, s.decision.target.key, s.decision.transition.value)
        for s in reversed(newest_first)
    ]


def test_a_small_group_submitted_after_a_large_one_is_handled_before_the_large_one_completes(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path) as api:
        api.engine.alerts.stop()  # both wait, as behind a worker busy with an earlier group
        large = [api.alert("GPUIdle", node=f"n{i // 8}", uuid=f"GPU-{i}") for i in range(1200)]
        assert api.notify(*large).json() == {"queued": 1200}
        urgent = api.alert("GPUFellOffBus", node="n7")
        assert api.notify(urgent).json() == {"queued": 1}
        api.engine.alerts.start()
        api.settle()
        order = stored_in_order(api)
        assert len(order) == 1201
        assert order[0] == (DRAIN, "node=n7", "fire"), "the GPU that fell off the bus first"
        assert {policy for policy, _, _ in order[1:]} == {RECLAIM}
        [outcome] = api.executed(DRAIN)
        assert outcome.ok


def test_an_alerts_older_notification_is_decided_before_its_newer_one_in_a_smaller_group(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path) as api:
        api.engine.alerts.stop()
        first = api.alert("GPUFellOffBus", node="n1")
        others = [api.alert("GPUIdle", node="n2", uuid=f"GPU-{i}") for i in range(20)]
        api.notify(*others[:10], first, *others[10:])
        # its next episode, alone in a notification: taken before the large group, but the
        # older notification of the same alert comes along first
        again = {**first, "startsAt": "2030-01-02T00:00:00Z"}
        api.notify(again)
        api.engine.alerts.start()
        api.settle()
        drains = [o for o in stored_in_order(api) if o[0] == DRAIN]
        assert drains == [(DRAIN, "node=n1", "fire")] * 2
        episodes = [
            s.decision.episode_start
            for s in reversed(api.engine.store.decisions(policy=DRAIN, limit=10))
        ]
        assert episodes == sorted(episodes), "the older episode first"
        assert stored_in_order(api)[0][0] == DRAIN  # before the larger group


def test_the_same_alert_twice_and_its_resolve_in_one_batch_act_once_each(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path) as api:
        api.engine.alerts.stop()
        fire = api.alert("GPUFellOffBus", node="n1")
        resolve = {**fire, "status": "resolved", "endsAt": "2030-01-01T00:05:00Z"}
        api.notify(fire)
        api.notify(fire)  # Alertmanager retried it
        api.notify(resolve)
        api.engine.alerts.start()  # all three in the worker's first batch
        api.settle()
        api.settle()  # the resolve, once the fire's action has succeeded
        done = [
            (d.transition.value, d.action.type if d.action else None)
            for d, o in api.decisions
            if o is not None
        ]
        assert done == [("fire", "migrate"), ("resolve", "notify")]
        metrics = api.call(None, "GET", "/metrics").text
        assert 'gpuops_api_alerts_total{result="duplicate"} 1.0' in metrics
        assert 'gpuops_api_alerts_total{result="handled"} 2.0' in metrics


def test_a_batch_whose_record_fails_is_handled_again_without_acting_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its decisions are stored (and audited) before the inbox records the batch: when that
    record fails (a fenced write, a crash), the alerts stay in the inbox, are handled again
    when adopted, and their decision ids keep them from acting twice."""
    with running_api(tmp_path) as api:
        store = api.engine.store
        record = store.alerts_handled
        failed: list[int] = []

        def fenced(keys: list[AlertKey], items: list[int], now: float) -> None:
            if not failed:
                failed.extend(items)
                raise StateError("fenced: this replica lost its lease")
            record(keys, items, now)

        monkeypatch.setattr(store, "alerts_handled", fenced)
        alerts: list[dict[str, Any]] = [api.alert("GPUFellOffBus", node=f"n{i}") for i in range(3)]
        api.notify(*alerts)
        api.settle()
        assert len(failed) == 3 and len(store.inbox()) == 3
        api.engine.alerts.adopt()  # the next election
        api.settle()
        assert store.inbox() == []
        assert sorted(o.ok for o in api.executed(DRAIN)) == [True] * 3
        assert len(store.decisions(policy=DRAIN)) == 3
