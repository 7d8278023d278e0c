"""What gpuops holds (``gpuops.api.routes.fleet.holds``), read from an engine's state: a fire
that ran holds its target while the episode goes on, with the decision and what it changed;
an undo held back by the kill switch is linked; the clear ends the hold; a fire that failed
holds nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuops.actions.base import PermanentError
from gpuops.api.fleetview import QUERIES
from gpuops.api.routes.fleet import UTILIZATION, holds, show_fleet, show_timeline
from gpuops.model.decisions import Decision
from gpuops.runtime import Engine
from tests.builders import Clock, build_engine
from tests.fakes.executors import Recorder
from tests.fakes.prometheus import FakePrometheus

EXPR = "nvml_gpu_temperature_celsius > 85"
RULES = f"""\
groups:
  - name: g
    interval: 1m
    rules:
      - policy: downclock-hot-gpus
        expr: {EXPR}
        target: [node, uuid]
        action: {{type: downclock, executor: log, params: {{max_clock_mhz: 1100}}}}
        on_clear: {{type: restore_clocks, executor: log}}
        mode: enforce
"""
HOT = {"node": "n1", "uuid": "GPU-1"}


def changed(decision: Decision) -> dict[str, Any]:
    return {"uuid": "GPU-1", "max_clock_mhz": 1100, "previous": 1980}


class World:
    def __init__(self, tmp: Path, fail: bool = False) -> None:
        self.prom = FakePrometheus()
        self.clock = Clock(2_000_000.0)
        recorder = Recorder("log", result=changed)
        if fail:
            recorder.fail = lambda d: PermanentError("the GPU refused the clocks")
        self.engine: Engine = build_engine(
            tmp, RULES, source=self.prom, clock=self.clock, executors={"log": recorder}
        )
        self.api: Any = SimpleNamespace(engine=self.engine)

    def evaluate(self, hot: bool) -> None:
        self.prom.results[EXPR] = [HOT] if hot else []
        policy = self.engine.rules.policy("downclock-hot-gpus")
        assert policy is not None
        self.engine.evaluate_policy(policy)
        assert self.engine.gate.wait_idle(10)
        self.clock.advance(60)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.engine.stop()


def test_a_fire_that_ran_holds_its_target_until_the_clear(world: World) -> None:
    world.evaluate(hot=True)
    (held,) = holds(world.api)
    assert held.labels == HOT
    h = held.hold
    assert (h.what, h.policy, h.action, h.undo, h.dry_run) == (
        "downclocked",
        "downclock-hot-gpus",
        "downclock",
        "restore_clocks",
        False,
    )
    assert h.effect == "clocks of GPU-1 capped at 1100 MHz, were 1980"
    stored = world.engine.store.decision(h.decision_id)
    assert stored is not None and stored.decision.target.labels["uuid"] == "GPU-1"
    assert h.undo_decision_id is None

    world.engine.set_control("kill_switch", True, "ops")
    world.evaluate(hot=False)  # cleared, its undo held back: still held, the undo linked
    (held,) = holds(world.api)
    undo = held.hold.undo_decision_id
    assert undo is not None
    found = world.engine.store.decision(undo)
    assert found is not None and found.decision.action is not None
    assert found.decision.action.type == "restore_clocks"

    world.engine.set_control("kill_switch", False, "ops")
    world.evaluate(hot=False)  # the undo runs: nothing held
    assert holds(world.api) == []


def test_a_fire_that_failed_holds_nothing(tmp_path: Path) -> None:
    w = World(tmp_path, fail=True)
    try:
        w.evaluate(hot=True)
        assert holds(w.api) == []
    finally:
        w.engine.stop()


def test_prometheus_away_is_said_once_and_not_asked_again(world: World) -> None:
    world.prom.results[QUERIES["up"]] = ConnectionError("connection refused")
    answer = show_fleet(world.api, None, None)  # type: ignore[arg-type]
    assert answer.errors == [
        "connection refused",
        f"the other {len(QUERIES) - 1} queries were not sent",
    ]
    assert answer.nodes == [] and answer.pending_jobs is None
    assert world.prom.queries == [QUERIES["up"]]
    world.prom.results[UTILIZATION] = ConnectionError("connection refused")
    timeline = show_timeline(world.api, None, since=None, until=None, pool="a100")  # type: ignore[arg-type]
    assert timeline.errors == ["connection refused"]
    assert timeline.utilization == timeline.queue == []
    assert world.prom.queries[-1] == UTILIZATION  # neither the queue nor the pools asked
