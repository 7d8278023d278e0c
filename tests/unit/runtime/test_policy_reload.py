"""Nothing twice must not become never: an action queued at the gate while a reload drops its
policy is decided again when the policy is loaded again (also after a restart), and the rule
watcher reads a directory that an editor, a tool or a checkout rewrites as one consistent
set, so that a file missing for a moment drops nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuops.model.decisions import Decision
from gpuops.runtime import Engine
from gpuops.runtime.rulebook import MISSING_GRACE_S
from tests.builders import Clock, build_engine
from tests.fakes.prometheus import FakePrometheus
from tests.waiting import wait_for

NODES = [f"n{i:02d}" for i in range(10)]

MIGRATE = """
groups:
  - name: nodes
    interval: 10s
    rules:
      - policy: migrate-off-down-nodes
        expr: up == 0
        for: {for_}
        target: [node]
        action: {{type: migrate, executor: log}}
        mode: enforce
"""

KEEP = """
groups:
  - name: other
    interval: 10s
    rules:
      - policy: keep
        expr: never > 0
        action: {type: notify, executor: log}
        mode: enforce
"""


class Blocking:
    """Runs an action once ``release`` is set (4 workers: 4 in flight, the rest queued);
    ``started`` holds every action a worker took, ``ran`` every action that ran."""

    name = "log"
    verbs: frozenset[str] | None = None

    def __init__(
        self, ran: list[Decision], release: threading.Event, started: list[Decision]
    ) -> None:
        self.ran = ran
        self.release = release
        self.started = started

    def run(self, decision: Decision) -> Mapping[str, Any]:
        self.started.append(decision)
        assert self.release.wait(30)
        self.ran.append(decision)
        return {}


@dataclass
class World:
    tmp: Path
    clock: Clock = field(default_factory=Clock)
    prom: FakePrometheus = field(default_factory=FakePrometheus)
    ran: list[Decision] = field(default_factory=list)
    started: list[Decision] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    engines: list[Engine] = field(default_factory=list)

    @property
    def rule_file(self) -> Path:
        return self.tmp / "rules" / "migrate.yaml"

    def engine(self, **settings: Any) -> Engine:
        engine = build_engine(
            self.tmp,
            source=self.prom,
            clock=self.clock,
            executors={"log": Blocking(self.ran, self.release, self.started)},
            **settings,
        )
        self.engines.append(engine)
        return engine

    def evaluate(self, engine: Engine, seconds: float = 0.0) -> list[Decision]:
        self.clock.now += seconds
        policy = engine.rules.policy("migrate-off-down-nodes")
        assert policy is not None
        return engine.evaluate_policy(policy)

    def four_in_flight(self) -> None:
        """Wait until the 4 workers hold an action each (the rest wait in the queue)."""
        wait_for(lambda: len(self.started) - len(self.ran) == 4, 10, "4 actions in flight")

    def acted(self) -> list[str]:
        return sorted(d.target.labels["node"] for d in self.ran)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    (tmp_path / "rules").mkdir()
    w.rule_file.write_text(MIGRATE.format(for_="0s"))
    (tmp_path / "rules" / "keep.yaml").write_text(KEEP)
    w.prom.results["up == 0"] = [{"node": n} for n in NODES]
    yield w
    w.release.set()
    for engine in w.engines:
        engine.stop()


def _queue_ten_and_drop_the_policy(world: World, engine: Engine) -> Path:
    """Decide on the 10 down nodes (4 actions start, 6 wait in the executor's queue), move
    the policy's file away and reload, then let the actions go: the 4 running ones finish,
    the 6 queued ones meet a rule set without their policy at the gate."""
    decided = world.evaluate(engine)
    assert len(decided) == 10 and all(d.verdict == "execute" for d in decided)
    world.four_in_flight()
    away = world.tmp / "migrate.yaml.moved"
    world.rule_file.rename(away)
    assert engine.reload().ok and engine.rules.policy("migrate-off-down-nodes") is None
    world.release.set()
    assert engine.wait_idle(10)
    assert len(world.ran) == 4
    held = [
        d for d in engine.store.decisions() if d.decision.verdict == "suppressed:policy_removed"
    ]
    assert len(held) == 6
    return away


def test_actions_held_while_their_policy_was_away_run_when_it_is_back(world: World) -> None:
    engine = world.engine()
    away = _queue_ten_and_drop_the_policy(world, engine)
    away.rename(world.rule_file)
    assert engine.reload().ok
    again = world.evaluate(engine, 10)
    assert engine.wait_idle(10)
    assert assert_each_once(world) == NODES
    assert len(again) == 6 and all(d.verdict == "execute" for d in again)
    assert world.evaluate(engine, 10) == []  # nothing twice


def test_held_actions_run_when_the_policy_is_back_after_a_restart(world: World) -> None:
    engine = world.engine()
    away = _queue_ten_and_drop_the_policy(world, engine)
    engine.stop()
    away.rename(world.rule_file)
    restarted = world.engine()
    world.evaluate(restarted, 10)
    assert restarted.wait_idle(10)
    assert assert_each_once(world) == NODES


def test_a_policy_away_past_the_grace_starts_its_held_targets_over(world: World) -> None:
    world.rule_file.write_text(MIGRATE.format(for_="60s"))
    engine = world.engine()
    world.evaluate(engine)  # pending
    away = world.tmp / "migrate.yaml.moved"
    world.clock.now += 60
    decided = world.evaluate(engine)
    assert len(decided) == 10
    world.four_in_flight()
    world.rule_file.rename(away)
    assert engine.reload().ok
    world.release.set()
    assert engine.wait_idle(10) and len(world.ran) == 4
    grace = engine.config.guardrails.action_max_age
    world.clock.now += grace + 1
    away.rename(world.rule_file)
    assert engine.reload().ok
    # nothing says the nodes were down while the policy was away: `for` counts again
    assert world.evaluate(engine, 10) == []
    assert engine.wait_idle(10) and len(world.ran) == 4
    again = world.evaluate(engine, 60)
    assert engine.wait_idle(10)
    assert len(again) == 6 and assert_each_once(world) == NODES


def assert_each_once(world: World) -> list[str]:
    acted = world.acted()
    assert len(acted) == len(set(acted)), acted
    return acted


def test_a_rule_file_renamed_away_for_a_moment_drops_nothing(world: World) -> None:
    """An editor that saves by renaming the old file away and writing a new one, a tool
    that deletes and re-creates it, a checkout: the watcher waits for the file."""
    engine = world.engine()
    name = "migrate-off-down-nodes"
    backup = world.tmp / "rules" / "migrate.yaml~"
    world.rule_file.rename(backup)
    for _ in range(3):  # missing, twice in a row, within the grace: not reloaded
        engine.check_reload()
        assert engine.rules.policy(name) is not None
        world.clock.now += 1
    world.rule_file.write_text(MIGRATE.format(for_="2m"))
    backup.unlink()
    engine.check_reload()  # changed: read again at the next check
    engine.check_reload()
    policy = engine.rules.policy(name)
    assert policy is not None and policy.for_s == 120


def test_a_rule_file_gone_past_the_grace_is_dropped(world: World) -> None:
    engine = world.engine()
    world.rule_file.unlink()
    engine.check_reload()
    engine.check_reload()
    assert engine.rules.policy("migrate-off-down-nodes") is not None
    world.clock.now += MISSING_GRACE_S + 1
    engine.check_reload()
    assert engine.rules.policy("migrate-off-down-nodes") is None
    assert engine.rules.policy("keep") is not None


def test_a_storm_of_rewrites_loses_no_action(world: World) -> None:
    """200 rewrites in a row (the policy changed, removed, re-created, the directory read by
    the watcher in between) while its 10 actions wait in the queue: when the storm is over
    and the file is back, every target has been acted on, each once."""
    engine = world.engine()
    world.evaluate(engine)
    variants = [MIGRATE.format(for_="0s"), MIGRATE.format(for_="0s") + "\n# edited\n", None]
    for i in range(200):
        text = variants[i % 3]
        if text is None:
            world.rule_file.unlink(missing_ok=True)
        else:
            world.rule_file.write_text(text)
        if i % 7 == 0:
            engine.reload()  # an explicit reload (the API, SIGHUP) in the middle of it
        engine.check_reload()
        world.clock.now += 0.05
        if i == 100:
            world.release.set()  # the queued actions meet the gate during the storm
    world.rule_file.write_text(MIGRATE.format(for_="0s"))
    assert engine.wait_idle(10)
    engine.check_reload()
    world.clock.now += MISSING_GRACE_S + 1
    engine.check_reload()
    assert engine.rules.policy("migrate-off-down-nodes") is not None
    world.evaluate(engine, 10)
    assert engine.wait_idle(10)
    wait_for(lambda: len(world.ran) == 10, 10, "every target acted on")
    assert assert_each_once(world) == NODES


REPEATING = """
groups:
  - name: nodes
    interval: 10s
    rules:
      - policy: migrate-off-down-nodes
        expr: up == 0
        target: [node]
        repeat_interval: 1m
        action: {type: migrate, executor: log}
        on_clear: {type: restore, executor: log}
        mode: enforce
"""


def test_past_the_grace_a_target_whose_action_ran_keeps_its_undo(world: World) -> None:
    """The first fire ran on every node; its repeat was held while the policy was away, past
    the grace: the nodes stay firing on the action that ran, and their clear restores them."""
    world.rule_file.write_text(REPEATING)
    world.release.set()
    engine = world.engine()
    world.evaluate(engine)
    assert engine.wait_idle(10) and len(world.ran) == 10
    world.release.clear()
    world.evaluate(engine, 60)  # the repeats: 4 start, 6 wait
    world.four_in_flight()
    away = world.tmp / "migrate.yaml.moved"
    world.rule_file.rename(away)
    assert engine.reload().ok
    world.release.set()
    assert engine.wait_idle(10) and len(world.ran) == 14
    world.clock.now += engine.config.guardrails.action_max_age + 1
    away.rename(world.rule_file)
    assert engine.reload().ok
    world.prom.results["up == 0"] = []  # the nodes are back
    world.evaluate(engine, 10)
    assert engine.wait_idle(10)
    restored = sorted(d.target.labels["node"] for d in world.ran if d.action.type == "restore")
    assert restored == NODES
