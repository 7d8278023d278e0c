"""The gate's per-action costs: outcomes that finish together are audited with one
spool write and one transaction; the stored kill switch and pause are read at most once a
second, and a switch set through the engine stops the very next action."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from gpuops.model.decisions import Decision, Outcome, OutcomeStatus
from gpuops.runtime.controls import Controls
from gpuops.runtime.gate.outcomes import OutcomeBatch
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from tests.unit.audit.factories import make_decision
from tests.waiting import wait_for

OK = Outcome(OutcomeStatus.SUCCESS, 1, 0.1)


def test_outcomes_handed_in_while_one_is_written_share_the_next_write() -> None:
    writes: list[list[str]] = []
    first_started, release = threading.Event(), threading.Event()

    def write(batch: Sequence[tuple[Decision, Outcome]]) -> None:
        writes.append([d.id for d, _ in batch])
        if len(writes) == 1:
            first_started.set()
            assert release.wait(10)

    outcomes = OutcomeBatch(write)
    decisions = [make_decision(labels={"uuid": f"GPU-{n}"}) for n in range(6)]
    first = threading.Thread(target=outcomes.write, args=(decisions[0], OK))
    first.start()
    assert first_started.wait(10)
    rest = [threading.Thread(target=outcomes.write, args=(d, OK)) for d in decisions[1:]]
    for t in rest:
        t.start()
    wait_for(lambda: len(outcomes._pending) == 5, 10, "the other outcomes to queue")
    assert all(t.is_alive() for t in rest)  # nobody returns before its outcome is written
    release.set()
    for t in [first, *rest]:
        t.join(10)
    assert len(writes) == 2  # the five that came during the first write: one write
    assert writes[0] == [decisions[0].id]
    assert sorted(writes[1]) == sorted(d.id for d in decisions[1:])


def test_a_failed_write_is_raised_in_every_worker_of_its_batch_only() -> None:
    calls: list[int] = []

    def write(batch: Sequence[tuple[Decision, Outcome]]) -> None:
        calls.append(len(batch))
        if len(calls) == 1:
            raise OSError("disk gone")

    outcomes = OutcomeBatch(write)
    with pytest.raises(OSError, match="disk gone"):
        outcomes.write(make_decision(), OK)
    outcomes.write(make_decision(labels={"uuid": "GPU-2"}), OK)  # the next batch is fine
    assert calls == [1, 1]


class CountingStore:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.reads = 0

    def control(self, name: str) -> str | None:
        self.reads += 1
        return self.values.get(name)

    def set_control(self, name: str, value: str | None) -> None:
        if value is None:
            self.values.pop(name, None)
        else:
            self.values[name] = value


def test_stored_switches_are_read_once_a_second_and_a_set_is_seen_at_once() -> None:
    store = CountingStore()
    metrics = EngineMetrics.create(CollectorRegistry())
    controls = Controls(store, GuardrailSettings(), metrics, clock=lambda: 0.0)
    for _ in range(100):  # an action each: the gate asks both
        assert not controls.kill_switch_on() and not controls.paused()
    assert store.reads == 2  # one read of each switch for the lot
    controls.set("kill_switch", True, "ops")
    assert controls.kill_switch_on()  # the very next action is held
    controls.set("kill_switch", False, "ops")
    controls.set("paused", True, "ops")
    assert not controls.kill_switch_on() and controls.paused()
    store.values["kill_switch"] = "other-process@1"  # not through ``set``: seen within 1 s
    wait_for(controls.kill_switch_on, 5, "the stored switch to be read again")
