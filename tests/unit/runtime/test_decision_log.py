"""The engine's log tells each decision it records and each outcome: policy, target, action,
verdict and reason, outcome in words, decision id; the lines about evaluations that changed
nothing come at ``log.quiet_level``; the JSON format carries the same as fields.

An engine of ``tests.builders`` on a scripted Prometheus with a recording executor; its log
read through pytest's ``caplog``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuops.cli import _JsonFormatter
from gpuops.model.decisions import Decision
from gpuops.runtime import Engine
from gpuops.settings import LogSettings
from tests.builders import Clock, build_engine
from tests.fakes.executors import Recorder
from tests.fakes.prometheus import FakePrometheus

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - policy: evacuate
        expr: up == 0
        for: 0s
        target: [node]
        action: {type: migrate, executor: log}
        on_clear: {type: resume, executor: log}
        mode: enforce
        annotations:
          summary: "Node {{ $labels.node }} is down: migrating its jobs"
      - policy: reclaim-approved
        expr: idle
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
        approval: required
      - policy: capped
        expr: hot
        for: 0s
        target: [uuid]
        action: {type: downclock, executor: log, params: {max_clock_mhz: 1100}}
        limits: {max_per_hour: 1}
        repeat_interval: 1s
        mode: enforce
"""

LOGGER = "gpuops.runtime.gate.told"


def changed(decision: Decision) -> Mapping[str, Any]:
    if decision.action is not None and decision.action.type == "migrate":
        return {"node": "node-3", "state": "drained", "moved": [], "requeued": ["job-1"]}
    if decision.action is not None and decision.action.type == "resume":
        return {"node": "node-3", "state": "up", "previous": "drained"}
    return {"uuid": "GPU-1", "max_clock_mhz": 1100, "previous": 1980}


class World:
    def __init__(self, tmp: Path, quiet: str = "debug") -> None:
        self.prom = FakePrometheus()
        self.clock = Clock(2_000_000.0)
        self.executor = Recorder("log", result=changed)
        self.engine: Engine = build_engine(
            tmp,
            RULES,
            source=self.prom,
            clock=self.clock,
            executors={"log": self.executor},
            log=LogSettings(quiet_level=quiet),  # type: ignore[arg-type]
        )

    def evaluate(self, policy: str) -> None:
        found = self.engine.rules.policy(policy)
        assert found is not None
        self.engine.evaluate_policy(found)
        assert self.engine.gate.wait_idle(10)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.engine.stop()


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


def test_a_decision_that_runs_and_its_undo_are_told_with_their_outcome_in_words(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    world.prom.results["up == 0"] = [{"node": "node-3"}]
    world.evaluate("evacuate")
    decision = world.executor.ran[0]
    told = lines(caplog)
    assert told == [
        "evacuate on node=node-3: migrate runs: condition held for 0s (for: 0s) — Node node-3 "
        f"is down: migrating its jobs [decision {decision.id}]",
        "evacuate on node=node-3: migrate no effect after 1 attempt: node-3 drained; job-1 "
        f"requeued: no free node; no job moved [decision {decision.id}]",
    ]
    actions = world.engine.metrics.registry.get_sample_value
    counted = {"executor": "log", "action": "migrate"}
    assert actions("gpuops_engine_actions_total", {**counted, "outcome": "no_effect"}) == 1
    assert actions("gpuops_engine_actions_total", {**counted, "outcome": "success"}) is None
    world.prom.results["up == 0"] = []
    world.clock.advance(10)
    world.evaluate("evacuate")
    undo = world.executor.ran[1]
    assert lines(caplog)[2:] == [
        f"evacuate on node=node-3: undo: resume runs: target left the result [decision {undo.id}]",
        "evacuate on node=node-3: undo: resume done after 1 attempt: node-3 back in service "
        f"(was drained) [decision {undo.id}]",
    ]


def test_waiting_for_approval_and_held_are_told(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    world.prom.results["idle"] = [{"uuid": "GPU-1"}]
    world.evaluate("reclaim-approved")
    assert not world.executor.ran
    (waiting,) = lines(caplog)
    assert waiting.startswith(
        "reclaim-approved on uuid=GPU-1: reclaim waits for an admin's approval"
    )
    world.prom.results["hot"] = [{"uuid": "GPU-1"}, {"uuid": "GPU-2"}]
    world.evaluate("capped")
    held = [line for line in lines(caplog, logging.WARNING) if "capped" in line]
    assert len(held) == 1 and "downclock held by max_per_hour" in held[0], held
    done = [line for line in lines(caplog) if "capped" in line and "done after" in line]
    assert done and "clocks of GPU-1 capped at 1100 MHz, were 1980" in done[0]


def test_the_nothing_happened_lines_come_at_their_configured_level(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for quiet, level in (("debug", logging.DEBUG), ("info", logging.INFO)):
        world = World(tmp_path / quiet, quiet)
        try:
            world.prom.results["hot"] = [{"uuid": "GPU-1"}, {"uuid": "GPU-2"}]
            world.evaluate("capped")
            caplog.clear()
            world.clock.advance(10)
            world.evaluate("capped")  # the held target is held again: nothing recorded
            again = [r for r in caplog.records if "held again as before" in r.getMessage()]
            assert [r.levelno for r in again] == [level]
        finally:
            world.engine.stop()


def test_json_lines_carry_the_decision_fields(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    world.prom.results["up == 0"] = [{"node": "node-3"}]
    world.evaluate("evacuate")
    outcome = json.loads(_JsonFormatter().format(caplog.records[-1]))
    assert outcome["rule.name"] == "evacuate"
    assert outcome["gpuops.target.key"] == "node=node-3"
    assert outcome["event.action"] == "migrate"
    assert outcome["gpuops.verdict"] == "execute"
    assert outcome["gpuops.state"] == "no effect"
    assert outcome["event.outcome"] == "success"
    assert outcome["gpuops.decision.id"] == world.executor.ran[0].id
    assert outcome["message"].startswith("evacuate on node=node-3: migrate no effect")
