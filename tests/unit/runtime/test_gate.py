"""The gate's promises, each on the path that could break it.

1. kill switch / pause at the moment of execution on every path: queued, resumed after a crash,
   granted approval, quota grant and its end, Alertmanager-triggered;
2. quota grants under dry-run and a zero global budget;
3. write-ahead audit that fails closed (an injected ENOSPC at the spool's write), and
   reconciliation at start;
4. an Alertmanager resolve that comes while the firing's action runs, or before the firing;
5. permanent vs temporary failures, and per-executor concurrency.

A scripted Prometheus, recording executors that block on events (tests/fakes/executors.py),
an injected clock, built by ``tests.builders``. ``/healthz`` of the running API:
tests/integration/runtime/test_gate_healthz.py; the SIGKILL and full-tmpfs runs:
tests/integration/runtime/test_gate_crash.py.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.retry import RetryPolicy
from gpuops.audit.spool import read_spool
from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    OutcomeStatus,
    Target,
    Transition,
    decision_id,
)
from gpuops.model.guardrails import Standing
from gpuops.runtime import Engine, ExecutorsRefused
from gpuops.settings import ApiSettings, GuardrailSettings, QuotaSettings
from gpuops.store.errors import StateError
from gpuops.store.interface import Audited, DecisionStatus
from tests.builders import Clock, build_engine, write_rules
from tests.fakes.executors import Recorder
from tests.fakes.prometheus import FakePrometheus
from tests.waiting import wait_for

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - policy: reclaim
        expr: idle
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        cooldown: 1h
        mode: enforce
      - policy: notify-slow
        expr: slow
        for: 0s
        target: [uuid]
        action: {type: notify, executor: webhook}
        mode: enforce
      - policy: reclaim-approved
        expr: approve
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
        approval: required
      - policy: evacuate
        expr: down
        for: 0s
        target: [uuid]
        action: {type: migrate, executor: log}
        limits: {max_fraction: 0.5, population: fleet}
        mode: enforce
      - policy: drain
        trigger: {alertmanager: {alertname: GPUFellOffBus}}
        target: [node]
        action: {type: migrate, executor: log}
        on_clear: {type: restore, executor: log}
        mode: enforce
"""


def ran(decision: Decision) -> Mapping[str, Any]:
    return {"ran": decision.id}


class World:
    """One directory, one fake Prometheus, one clock and two recording executors (``log`` and
    ``webhook``) for every engine a test builds on them (a restart is another ``engine()``)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.prom = FakePrometheus()
        self.clock = Clock(2_000_000.0)
        self.log = Recorder("log", result=ran)
        self.webhook = Recorder("webhook", result=ran)
        self.engines: list[Engine] = []
        write_rules(tmp, RULES)

    def engine(
        self, workers: int = 4, retry: RetryPolicy | None = None, **guardrails: Any
    ) -> Engine:
        engine = build_engine(
            self.tmp,
            source=self.prom,
            clock=self.clock,
            executors={"log": self.log, "webhook": self.webhook},
            guardrails=GuardrailSettings(**guardrails),
            api=ApiSettings(quota=QuotaSettings(executor="log", check_interval=3600)),
            action_workers=workers,
            action_retry=retry or RetryPolicy(attempts=1),  # no sleeping between tries
        )
        self.engines.append(engine)
        return engine

    def evaluate(self, engine: Engine, policy: str) -> list[Decision]:
        found = engine.rules.policy(policy)
        assert found is not None
        return engine.evaluate_policy(found)

    def docs(self) -> list[dict[str, Any]]:
        return [d for d in read_spool(self.tmp / "audit") if "gpuops" in d]

    def verdicts(self, policy: str) -> list[tuple[str, str]]:
        """(verdict, outcome status) of ``policy``'s decision documents, in spool order."""
        return [
            (d["gpuops"]["verdict"], (d["gpuops"].get("outcome") or {}).get("status", "none"))
            for d in self.docs()
            if d["rule"]["name"] == policy
        ]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.log.gate.set()
    w.webhook.gate.set()
    for engine in w.engines:
        engine.stop()


def uuids(n: int) -> list[dict[str, str]]:
    return [{"uuid": f"GPU-{i:02d}"} for i in range(n)]


def metric(engine: Engine, name: str, **labels: str) -> float:
    value = engine.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


# --- 1. kill switch and pause at the moment of execution ------------------------------------


def test_kill_switch_stops_the_queued_actions(world: World) -> None:
    """12 targets fire and the switch comes on just after the first action started: that one
    finishes, none of the 11 queued behind it starts."""
    engine = world.engine(workers=1)
    world.prom.results["idle"] = uuids(12)
    world.log.gate.clear()
    decisions = world.evaluate(engine, "reclaim")
    assert [d.verdict for d in decisions] == ["execute"] * 12
    assert world.log.started.wait(10)
    engine.set_control("kill_switch", True, "ops")
    world.log.gate.set()
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1
    held = [v for v in world.verdicts("reclaim") if v[0] == "suppressed:kill_switch"]
    assert held == [("suppressed:kill_switch", "skipped")] * 11
    assert metric(engine, "gpuops_engine_actions_held_total", reason="kill_switch") == 11
    stored = engine.store.decision(decisions[-1].id)
    assert stored is not None and stored.decision.verdict == "suppressed:kill_switch"
    assert "held at the gate" in stored.decision.reason


def test_pause_holds_the_queued_actions_and_they_are_decided_again(world: World) -> None:
    engine = world.engine(workers=1)
    world.prom.results["idle"] = uuids(3)
    world.log.gate.clear()
    world.evaluate(engine, "reclaim")
    assert world.log.started.wait(10)
    engine.set_control("paused", True, "ops")
    world.log.gate.set()
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1
    engine.set_control("paused", False, "ops")
    world.clock.now += 61  # RETRY_S: what the gate held is decided again
    again = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert len(again) == 2 and all(d.verdict == "execute" for d in again)
    assert sorted(d.target.key for d in world.log.ran) == [
        "uuid=GPU-00",
        "uuid=GPU-01",
        "uuid=GPU-02",
    ]


def test_resumed_actions_are_held_when_the_switch_is_on(world: World) -> None:
    """Two actions interrupted by a crash, the switch on at restart: neither runs, both are
    held."""
    engine = world.engine()
    engine.gate._submit = lambda decision: None  # type: ignore[method-assign]  # the crash
    world.prom.results["idle"] = uuids(2)
    world.evaluate(engine, "reclaim")
    assert len(engine.store.unfinished()) == 2
    engine.set_control("kill_switch", True, "ops")
    engine.stop()
    restarted = world.engine()
    restarted.start()
    assert restarted.wait_idle(10)
    assert world.log.ran == []
    assert restarted.store.unfinished() == []
    assert [v for v in world.verdicts("reclaim") if v[0] != "execute"] == [
        ("suppressed:kill_switch", "skipped")
    ] * 2


def test_a_granted_approval_is_held_at_execution_time(world: World) -> None:
    engine = world.engine(workers=1)
    world.prom.results["idle"] = uuids(1)
    world.prom.results["approve"] = uuids(1)
    world.log.gate.clear()
    world.evaluate(engine, "reclaim")  # occupies the log executor's only worker
    assert world.log.started.wait(10)
    (waiting,) = world.evaluate(engine, "reclaim-approved")
    assert waiting.verdict == "awaiting_approval"
    granted = engine.grant(waiting.id, "alice")
    assert granted.verdict == "execute"  # queued behind the running action
    engine.set_control("kill_switch", True, "ops")
    world.log.gate.set()
    assert engine.wait_idle(10)
    assert [d.policy for d in world.log.ran] == ["reclaim"]
    assert world.verdicts("reclaim-approved")[-1] == ("suppressed:kill_switch", "skipped")


def test_an_alert_triggered_action_is_held_at_execution_time(world: World) -> None:
    engine = world.engine(workers=1)
    world.prom.results["idle"] = uuids(1)
    world.log.gate.clear()
    world.evaluate(engine, "reclaim")
    assert world.log.started.wait(10)
    alert = _alert("firing")
    (decision,) = engine.handle_alert(alert)
    assert decision.verdict == "execute"
    engine.set_control("kill_switch", True, "ops")
    world.log.gate.set()
    assert engine.wait_idle(10)
    assert [d.policy for d in world.log.ran] == ["reclaim"]
    assert world.verdicts("drain")[-1] == ("suppressed:kill_switch", "skipped")


# --- 2. quota grants pass the same judgement and gate ---------------------------------------


def _quota(engine: Engine) -> str:
    request = engine.quota.submit("vision", 8, 3600, "paper deadline", "dave")
    return request.id


def test_a_quota_grant_under_dry_run_executes_nothing(world: World) -> None:
    """With --dry-run and global_max_per_hour 0, an approved quota request runs no
    scale_out."""
    engine = world.engine(dry_run=True)
    approved = engine.quota.approve(_quota(engine), "alice")
    assert world.log.ran == []
    assert approved.status == "dry_run"  # approved, not applied
    assert world.verdicts("quota-request") == [("dry_run", "none")]
    world.clock.now += 3601
    engine.quota.tick()
    assert engine.quota.get(approved.id).status == "ended"
    assert world.log.ran == []
    assert world.verdicts("quota-request") == [("dry_run", "none")]  # nothing to undo


def test_a_quota_grant_over_the_global_budget_executes_nothing(world: World) -> None:
    engine = world.engine(global_max_per_hour=0)
    approved = engine.quota.approve(_quota(engine), "alice")
    assert world.log.ran == []
    assert approved.status == "applying" and "global budget 0" in (approved.error or "")
    assert world.verdicts("quota-request") == [("suppressed:global_budget", "none")]
    engine.quota.tick()  # held: not decided again before its retry time
    assert world.verdicts("quota-request") == [("suppressed:global_budget", "none")]
    world.clock.now += 61
    engine.quota.tick()  # decided again (a new decision id), held again: nothing ran
    assert world.verdicts("quota-request") == [("suppressed:global_budget", "none")] * 2
    assert world.log.ran == [] and engine.quota.get(approved.id).apply_attempts == 2


def test_a_quota_end_runs_through_the_gate(world: World) -> None:
    engine = world.engine()
    approved = engine.quota.approve(_quota(engine), "alice")
    assert [d.action.type for d in world.log.ran if d.action] == ["scale_out"]
    engine.set_control("paused", True, "ops")
    world.clock.now += 3601
    engine.quota.tick()
    assert engine.quota.get(approved.id).status == "releasing"
    assert len(world.log.ran) == 1
    engine.set_control("paused", False, "ops")
    engine.quota.tick()
    assert engine.quota.get(approved.id).status == "ended"
    assert [d.action.type for d in world.log.ran if d.action] == ["scale_out", "scale_in"]


def test_quota_requests_end_without_the_api(world: World) -> None:
    """The quota ticker is the engine's scheduler job: with ``api.listen: null`` (no API
    app at all) an active grant still ends."""
    engine = world.engine()
    approved = engine.quota.approve(_quota(engine), "alice")
    engine.start()
    assert engine._jobs is not None
    assert engine._jobs.scheduler.get_job("gpuops-quota") is not None
    world.clock.now += 3601
    engine._quota_tick()
    assert engine.quota.get(approved.id).status == "ended"


# --- 3. write-ahead audit, fail closed --------------------------------------------------------


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """``full(True)``: every write of the spool fails with ENOSPC (as on a full disk)."""
    state = {"full": False}
    real = os.fsync

    def fsync(fd: int) -> None:
        if state["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr("gpuops.audit.spool.writer.os.fsync", fsync)
    return lambda full: state.__setitem__("full", full)


def test_no_action_runs_when_its_intent_cannot_be_written(
    world: World, full_disk: Callable[[bool], None]
) -> None:
    """On a full disk no action runs: every action that runs has its document."""
    engine = world.engine()
    world.prom.results["idle"] = uuids(5)
    full_disk(True)
    decisions = world.evaluate(engine, "reclaim")
    assert len(decisions) == 5
    assert engine.wait_idle(10)
    assert world.log.ran == []
    assert engine.problem() is not None and "No space left" in (engine.problem() or "")
    assert metric(engine, "gpuops_engine_audit_write_failures_total", what="intent") == 5
    assert metric(engine, "gpuops_engine_audit_writable") == 0
    assert world.verdicts("reclaim") == []
    assert engine.gate.reconcile() == 0  # still full: nothing runs
    assert world.log.ran == []
    full_disk(False)
    assert engine.gate.reconcile() == 5
    assert engine.wait_idle(10)
    assert sorted(d.id for d in world.log.ran) == sorted(d.id for d in decisions)
    assert engine.problem() is None and metric(engine, "gpuops_engine_audit_writable") == 1
    intents = [d for d in world.docs() if "outcome" not in d["gpuops"]]
    outcomes = [d for d in world.docs() if "outcome" in d["gpuops"]]
    assert len(intents) == 5 and len(outcomes) == 5
    # every outcome after its intent
    order = [(d["gpuops"]["decision"]["id"], "outcome" not in d["gpuops"]) for d in world.docs()]
    for decision in decisions:
        assert order.index((decision.id, True)) < order.index((decision.id, False))


def test_a_crash_between_commit_and_intent_is_reconciled_at_start(world: World) -> None:
    engine = world.engine()
    engine.gate.admit = lambda decisions, runs: {}  # type: ignore[method-assign]  # the crash
    world.prom.results["idle"] = uuids(2)
    decisions = world.evaluate(engine, "reclaim")
    assert world.docs() == []
    engine.stop()
    restarted = world.engine()
    restarted.start()
    assert restarted.wait_idle(10)
    assert sorted(d.id for d in world.log.ran) == sorted(d.id for d in decisions)
    ids = [d["gpuops"]["decision"]["id"] for d in world.docs()]
    assert sorted(set(ids)) == sorted(d.id for d in decisions)
    assert restarted.store.unaudited() == []


def test_an_old_state_file_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    from gpuops.store.sqlite import StateStore
    from gpuops.store.sqlite.schema import MIGRATIONS

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE decisions (id TEXT PRIMARY KEY, policy TEXT NOT NULL, target TEXT NOT"
        " NULL, transition TEXT NOT NULL, verdict TEXT NOT NULL, at REAL NOT NULL, status TEXT"
        " NOT NULL, outcome TEXT, data TEXT NOT NULL);"
        "INSERT INTO decisions VALUES ('d1', 'p', 't', 'fire', 'execute', 1, 'done', NULL, '{}');"
    )
    db.close()
    store = StateStore(path)
    version = store._db.execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS)
    assert store.unaudited() == []  # decisions of an old file were audited after acting
    store.close()


# --- 4. alert episodes remember their resolve -------------------------------------------------


def _alert(status: str) -> Alert:
    return Alert(
        fingerprint="",
        status=AlertStatus(status),
        labels={"alertname": "GPUFellOffBus", "node": "n1"},
        starts_at="2030-01-01T00:00:00Z",
    )


def test_a_resolve_while_the_fire_runs_undoes_once_it_succeeded(world: World) -> None:
    """A resolve that comes while the fire's action runs undoes it once it has succeeded."""
    engine = world.engine()
    world.log.gate.clear()
    engine.handle_alert(_alert("firing"))
    assert world.log.started.wait(10)
    assert engine.handle_alert(_alert("resolved")) == []  # waits for the fire
    world.log.gate.set()
    assert engine.wait_idle(10)
    wait_for(lambda: len(world.log.ran) == 2, 10, "the undo")
    assert engine.wait_idle(10)
    assert [d.action.type for d in world.log.ran if d.action] == ["migrate", "restore"]


def test_a_resolve_before_the_firing_undoes_after_the_fire(world: World) -> None:
    engine = world.engine()
    assert engine.handle_alert(_alert("resolved")) == []
    engine.handle_alert(_alert("firing"))
    wait_for(lambda: len(world.log.ran) == 2, 10, "the fire and its undo")
    assert engine.wait_idle(10)
    assert [d.action.type for d in world.log.ran if d.action] == ["migrate", "restore"]


def test_a_resolve_of_a_failed_fire_undoes_nothing(world: World) -> None:
    engine = world.engine()
    world.log.gate.clear()
    world.log.fail = lambda d: PermanentError("fleet answered 404")
    engine.handle_alert(_alert("firing"))
    assert world.log.started.wait(10)
    engine.handle_alert(_alert("resolved"))
    world.log.gate.set()
    assert engine.wait_idle(10)
    wait_for(
        lambda: any(d["gpuops"]["transition"] == "resolve" for d in world.docs()), 10, "resolve"
    )
    assert [d.action.type for d in world.log.ran if d.action] == ["migrate"]


# --- 5. failures classified, concurrency per executor -----------------------------------------


def test_a_permanent_failure_is_not_retried_within_the_episode(world: World) -> None:
    """An executor answering 404 is not tried again while the condition holds."""
    engine = world.engine()
    world.log.fail = lambda d: PermanentError("fleet answered 404")
    world.prom.results["idle"] = uuids(1)
    (first,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    for _ in range(10):
        world.clock.now += 120
        assert world.evaluate(engine, "reclaim") == []
    assert engine.wait_idle(10)
    assert [d.id for d in world.log.ran] == [first.id]
    assert metric(engine, "gpuops_engine_permanent_failures_total", policy="reclaim") == 1
    stored = engine.store.decision(first.id)
    assert stored is not None and stored.outcome is not None and stored.outcome.permanent
    # a new episode acts again
    world.prom.results["idle"] = []
    world.clock.now += 10
    world.evaluate(engine, "reclaim")
    world.prom.results["idle"] = uuids(1)
    world.log.fail = lambda d: None
    world.clock.now += 10
    (second,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert second.id != first.id and world.log.ran[-1].id == second.id


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (IsADirectoryError(21, "Is a directory", "."), "IsADirectoryError: [Errno 21]"),
        (RuntimeError("a bug"), "RuntimeError: a bug"),
        (ValueError("executors.log settings: x: bad"), "executors.log settings: x: bad"),
    ],
)
def test_an_executor_that_cannot_be_built_fails_its_action_for_good(
    world: World, caplog: pytest.LogCaptureFixture, error: Exception, said: str
) -> None:
    """Whatever building the executor raises (a token file that cannot be read, a bug, bad
    settings), the action fails permanently: the outcome is stored and audited, and logged;
    the decision never stays started without one."""

    def broken(settings: Mapping[str, Any]) -> Recorder:
        raise error

    engine = build_engine(
        world.tmp,
        source=world.prom,
        clock=world.clock,
        executors={"log": broken, "webhook": world.webhook},
        action_retry=RetryPolicy(attempts=1),
    )
    world.engines.append(engine)
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    stored = engine.store.decision(decision.id)
    assert stored is not None and stored.status is DecisionStatus.DONE
    assert stored.outcome is not None and stored.outcome.permanent and not stored.outcome.ok
    assert stored.outcome.error is not None and stored.outcome.error.startswith("executor 'log': ")
    assert said in stored.outcome.error
    (audited,) = [d for d in world.docs() if "outcome" in d["gpuops"]]
    assert audited["gpuops"]["decision"]["id"] == decision.id
    assert audited["gpuops"]["outcome"]["status"] == "failure"
    assert audited["error"]["message"] == stored.outcome.error
    assert any(decision.id in r.getMessage() and said in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("configured", "said"),
    [
        ({"fleet": {"timeout_s": "soon"}}, r"^executors\.fleet settings: timeout_s: "),
        (
            {"nvml-agent": {"token_file": "TMP/absent/token"}},
            r"^executors\.nvml-agent settings: token_file: '.*/absent/token' cannot be read: "
            "No such file or directory$",
        ),
        (
            {"webhook": {"url": "http://h/", "hmac_secret_file": "TMP"}},
            r"^executors\.webhook settings: hmac_secret_file: '.*' cannot be read: Is a directory$",
        ),
        ({"flet": {}}, r"^executors\.flet: unknown executor 'flet' \(known: .*fleet"),
    ],
)
def test_the_engine_does_not_start_on_an_executor_it_cannot_build(
    world: World, configured: dict[str, dict[str, str]], said: str
) -> None:
    """Every configured executor is built at start, not at its first action: a mistake in its
    settings or a file of secrets it cannot read stops the start, naming executor and key."""
    settings = {
        name: {k: v.replace("TMP", str(world.tmp)) for k, v in s.items()}
        for name, s in configured.items()
    }
    engine = build_engine(world.tmp, source=world.prom, clock=world.clock, executors=None,
                          executor_settings=settings)  # fmt: skip
    world.engines.append(engine)
    with pytest.raises(ExecutorsRefused, match=said):
        engine.start()
    assert not engine.store.decisions(None, None, 10)  # nothing was evaluated


def test_temporary_failures_back_off_exponentially(world: World) -> None:
    engine = world.engine()
    world.log.fail = lambda d: TemporaryError("503")
    world.prom.results["idle"] = uuids(1)
    world.evaluate(engine, "reclaim")
    assert engine.wait_idle(30)
    tries_at = [world.clock.now]
    for _ in range(40):  # 4 more decisions need 60 + 120 + 240 + 480 s
        world.clock.now += 30
        if world.evaluate(engine, "reclaim"):
            assert engine.wait_idle(30)
            tries_at.append(world.clock.now)
        if len(tries_at) == 4:
            break
    gaps = [b - a for a, b in zip(tries_at, tries_at[1:], strict=False)]
    assert gaps == [60, 120, 240]


def test_one_slow_executor_does_not_delay_another(world: World) -> None:
    """One slow executor (30 s, 3 tries) does not delay a healthy policy's action: each
    executor has workers of its own."""
    engine = world.engine(workers=2)
    world.webhook.gate.clear()  # the slow receiver: holds every worker it gets
    world.prom.results["slow"] = uuids(6)
    world.evaluate(engine, "notify-slow")
    assert world.webhook.started.wait(10)
    world.prom.results["idle"] = uuids(1)
    world.evaluate(engine, "reclaim")
    wait_for(lambda: len(world.log.ran) == 1, 10, "the healthy policy's action")
    assert len(world.webhook.ran) == 2  # its own pool: at most 2 at a time
    world.webhook.gate.set()
    assert engine.wait_idle(10)
    assert len(world.webhook.ran) == 6


def test_every_stored_decision_has_an_audit_document(world: World) -> None:
    engine = world.engine()
    world.prom.results["idle"] = uuids(4)
    world.prom.results["approve"] = uuids(2)
    world.evaluate(engine, "reclaim")
    world.evaluate(engine, "reclaim-approved")
    engine.handle_alert(_alert("firing"))
    assert engine.wait_idle(10)
    stored = {d.id for d in engine.store.decisions(limit=1000)}
    audited = {d["gpuops"]["decision"]["id"] for d in world.docs()}
    assert len(stored) == 7 and stored <= audited
    assert engine.store.unaudited() == []


def test_outcomes_the_spool_could_not_take_are_written_when_it_can(
    world: World, full_disk: Callable[[bool], None]
) -> None:
    """Actions whose intent is in the spool may run (resumed after a crash); their outcomes
    wait in the state file while the spool is full, and reconciliation writes them."""
    engine = world.engine()
    engine.gate._submit = lambda decision: None  # type: ignore[method-assign]  # the crash
    world.prom.results["idle"] = uuids(2)
    decisions = world.evaluate(engine, "reclaim")  # intents written, actions never ran
    engine.stop()
    restarted = world.engine()
    full_disk(True)
    restarted.gate.resume()
    assert restarted.wait_idle(10)
    assert len(world.log.ran) == 2
    assert restarted.problem() is not None and "outcome not written" in restarted.problem()
    assert not any("outcome" in d["gpuops"] for d in world.docs())
    full_disk(False)
    assert restarted.gate.reconcile() == 2
    assert restarted.problem() is None and restarted.store.unaudited() == []
    outcomes = {d["gpuops"]["decision"]["id"] for d in world.docs() if "outcome" in d["gpuops"]}
    assert outcomes == {d.id for d in decisions}


def test_a_resolve_waiting_for_a_held_fire_undoes_nothing(world: World) -> None:
    engine = world.engine(workers=1)
    world.prom.results["idle"] = uuids(1)
    world.log.gate.clear()
    world.evaluate(engine, "reclaim")  # occupies the only worker
    assert world.log.started.wait(10)
    engine.handle_alert(_alert("firing"))  # queued
    assert engine.handle_alert(_alert("resolved")) == []  # waits for the fire
    engine.set_control("kill_switch", True, "ops")
    world.log.gate.set()
    assert engine.wait_idle(10)
    wait_for(
        lambda: any(d["gpuops"]["transition"] == "resolve" for d in world.docs()), 10, "resolve"
    )
    assert [d.policy for d in world.log.ran] == ["reclaim"]
    (resolve,) = [d for d in world.docs() if d["gpuops"]["transition"] == "resolve"]
    # decided, not forgotten; nothing ran, so the kill switch held nothing back
    assert resolve["gpuops"]["verdict"] == "execute" and "action" not in resolve["gpuops"]
    assert "nothing to undo" in resolve["gpuops"]["reason"]


def test_an_admin_retries_a_permanent_failure(world: World) -> None:
    from gpuops.runtime.gate import RetryError

    engine = world.engine()
    world.log.fail = lambda d: PermanentError("fleet answered 404")
    world.prom.results["idle"] = uuids(1)
    (first,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    world.log.fail = lambda d: None
    world.clock.now += 120
    assert world.evaluate(engine, "reclaim") == []
    engine.retry(first.id)
    # a second retry of the same failed decision (a double click) must not make the target
    # act twice in one episode: a failed decision is retried once
    with pytest.raises(RetryError, match="retried already"):
        engine.retry(first.id)
    (second,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert second.verdict == "execute" and world.log.ran[-1].id == second.id
    with pytest.raises(RetryError, match="did not fail"):
        engine.retry(second.id)
    world.clock.now += 120
    assert world.evaluate(engine, "reclaim") == []
    assert [d.id for d in world.log.ran] == [first.id, second.id]
    with pytest.raises(LookupError):
        engine.retry("0" * 24)


# --- 6. the gate applies everything at the moment of execution ------------------------------


def _blocked(world: World, engine: Engine) -> None:
    """Occupy the log executor's only worker with a reclaim of GPU-99 until the test releases
    ``world.log.gate``: what is decided next waits in its queue."""
    world.prom.results["idle"] = [{"uuid": "GPU-99"}]
    world.log.gate.clear()
    world.evaluate(engine, "reclaim")
    assert world.log.started.wait(10)


def test_the_blast_radius_is_checked_again_at_execution(world: World) -> None:
    """Two evacuations judged while 4 nodes were known, started when the population cannot
    be counted (a partition): both are held with the reason (the gate checks the blast radius
    again, not only the kill switch, pause, dry-run and the global budget)."""
    engine = world.engine(workers=1)
    _blocked(world, engine)
    world.prom.results["fleet"] = uuids(4)
    world.prom.results["down"] = uuids(2)
    judged = world.evaluate(engine, "evacuate")
    assert [d.verdict for d in judged] == ["execute", "execute"]  # 2 of 4 allowed
    world.prom.results["fleet"] = Exception("Prometheus unreachable")
    # the gate counts again when they start, even at the time they were judged at (a count
    # reused for 30 s would act on a fleet that had shrunk, or was unreachable)
    world.log.gate.set()
    assert engine.wait_idle(10)
    assert [d.policy for d in world.log.ran] == ["reclaim"]
    assert world.verdicts("evacuate")[-2:] == [("suppressed:max_fraction", "skipped")] * 2
    stored = engine.store.decision(judged[0].id)
    assert stored is not None and "population unknown" in stored.decision.reason


def test_a_veto_the_executor_reads_holds_the_action_with_its_reason(world: World) -> None:
    """The executor's standing (a node labelled gpuops.io/do-not-touch=true) is read by the
    gate when the action starts: held as ``suppressed:veto``, never run."""
    engine = world.engine(workers=1)
    vetoed = {"GPU-01"}

    def standing(decision: Decision) -> Standing:
        uuid = decision.target.labels["uuid"]
        return Standing(veto=f"node of {uuid} is labelled x=y" if uuid in vetoed else None)

    world.log.standing = standing  # type: ignore[attr-defined]
    world.prom.results["idle"] = uuids(2)
    judged = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert [d.target.key for d in world.log.ran] == ["uuid=GPU-00"]
    stored = engine.store.decision(judged[1].id)
    assert stored is not None and stored.decision.verdict == "suppressed:veto"
    assert stored.decision.reason == "held at the gate: veto: node of GPU-01 is labelled x=y"
    assert ("suppressed:veto", "skipped") in world.verdicts("reclaim")


def test_under_dry_run_the_executor_is_neither_asked_nor_run(world: World) -> None:
    """Engine dry-run: the gate records the decision without asking the executor anything (a
    Kubernetes executor's standing reads the API server) and without running it."""
    engine = world.engine(dry_run=True)
    asked: list[Decision] = []
    world.log.standing = asked.append  # type: ignore[attr-defined]
    world.prom.results["idle"] = uuids(2)
    judged = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert [d.verdict for d in judged] == ["dry_run", "dry_run"]
    assert asked == [] and world.log.ran == []


def test_max_fraction_counts_the_targets_already_out_whoever_took_them_out(
    world: World,
) -> None:
    """4 nodes, max_fraction 0.5 (2 allowed), 2 already cordoned by an admin: the executor
    says so and the gate holds the evacuation that would take a third out. The policy's own
    ``limits.population`` (4) wins over the executor's count (400 selected nodes)."""
    engine = world.engine(workers=1)
    world.log.standing = lambda decision: Standing(  # type: ignore[attr-defined]
        unavailable=frozenset({"n3", "n4"}), population=400
    )
    world.prom.results["fleet"] = uuids(4)
    world.prom.results["down"] = uuids(1)
    (judged,) = world.evaluate(engine, "evacuate")
    assert engine.wait_idle(10)
    assert world.log.ran == []
    stored = engine.store.decision(judged.id)
    assert stored is not None and stored.decision.verdict == "suppressed:max_fraction"
    assert "2 of 4 already unschedulable or not ready (n3, n4)" in stored.decision.reason


def test_a_tightened_rate_limit_holds_queued_actions(world: World) -> None:
    """The policy as loaded at execution: max_per_hour lowered to 1 while 2 actions of it
    wait in the queue behind its first — they are held, not run, and leave no trace in the
    rate window (so they are decided again when it allows)."""
    engine = world.engine(workers=1)
    world.prom.results["idle"] = uuids(3)
    world.log.gate.clear()
    first, *queued = world.evaluate(engine, "reclaim")
    assert world.log.started.wait(10)
    rules = world.tmp / "rules" / "p.yaml"
    rules.write_text(
        RULES.replace("cooldown: 1h\n", "cooldown: 1h\n        limits: {max_per_hour: 1}\n", 1)
    )
    engine.reload(strict=True)
    world.log.gate.set()
    assert engine.wait_idle(10)
    assert [d.id for d in world.log.ran] == [first.id]
    assert world.verdicts("reclaim")[-2:] == [("suppressed:max_per_hour", "skipped")] * 2
    recent = engine.store.guardrail_state().recent
    assert [e.target for e in recent] == [first.target.key]


def test_no_retry_attempt_starts_after_the_kill_switch(world: World) -> None:
    """An action failing temporarily is not tried again once the switch came on after its
    first try (the retry loop of gpuops.actions.base reads it between tries)."""
    engine = world.engine(retry=RetryPolicy(attempts=3, backoff_s=0.0))

    def fail(decision: Decision) -> Exception:
        engine.set_control("kill_switch", True, "ops")
        return TemporaryError("503")

    world.log.fail = fail
    world.prom.results["idle"] = uuids(1)
    world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1
    assert world.verdicts("reclaim")[-1] == ("suppressed:kill_switch", "skipped")


def test_no_retry_attempt_starts_after_the_lease_is_lost(world: World) -> None:
    """A replica that lost its lease after an action's first try stops trying, stores nothing
    and leaves the decision started for the new leader to resume (the retry loop asks
    leadership as well as the kill switch and pause)."""
    engine = world.engine(retry=RetryPolicy(attempts=3, backoff_s=0.0))

    def fail(decision: Decision) -> Exception:
        engine.gate._leading = lambda: False  # the lease lost during the first try
        return TemporaryError("503")

    world.log.fail = fail
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1
    stored = engine.store.decision(decision.id)
    assert stored is not None and stored.status is DecisionStatus.STARTED
    assert world.verdicts("reclaim") == [("execute", "none")]  # the intent; no outcome


def test_a_store_error_while_admitting_is_finished_by_reconcile(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded as started, its intent in the spool, then the store fails to mark it: the gate
    has a problem (``reconcile`` runs only then), and ``reconcile`` runs the action once."""
    engine = world.engine()
    mark = engine.store.mark_audited

    def broken(ids: Any, level: Any) -> None:
        monkeypatch.setattr(engine.store, "mark_audited", mark)
        raise StateError("database is locked")

    monkeypatch.setattr(engine.store, "mark_audited", broken)
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert world.log.ran == [] and engine.gate.problem is not None
    engine.gate.reconcile()
    assert engine.wait_idle(10)
    assert [d.id for d in world.log.ran] == [decision.id]
    assert engine.gate.problem is None


def _crashed_with_one_started(world: World) -> tuple[Engine, Decision]:
    engine = world.engine()
    engine.gate._submit = lambda decision: None  # type: ignore[method-assign]  # the crash
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert [d.id for d in engine.store.unfinished()] == [decision.id]
    engine.stop()
    return engine, decision


def test_a_resumed_decision_of_a_removed_policy_does_not_run(world: World) -> None:
    """A decision interrupted by a crash does not run at restart when its policy was removed
    from the rule set meanwhile."""
    _, decision = _crashed_with_one_started(world)
    rules = world.tmp / "rules" / "p.yaml"
    rules.write_text(RULES.replace("policy: reclaim\n", "policy: reclaim-renamed\n", 1))
    restarted = world.engine()
    restarted.gate.resume()  # what ``start`` does first
    assert restarted.wait_idle(10)
    assert world.log.ran == []
    assert world.verdicts("reclaim")[-1] == ("suppressed:policy_removed", "skipped")
    stored = restarted.store.decision(decision.id)
    assert stored is not None and stored.status == "done"


def test_an_old_interrupted_decision_expires_and_is_decided_again(world: World) -> None:
    """An action decided before a two-hour outage does not run at restart on data two hours
    old: it is audited as expired, and the next evaluation decides its target on fresh
    data."""
    _, decision = _crashed_with_one_started(world)
    world.clock.now += 7200  # action_max_age is an hour
    restarted = world.engine()
    restarted.gate.resume()  # what ``start`` does first
    assert restarted.wait_idle(10)
    assert world.log.ran == []
    assert world.verdicts("reclaim")[-1] == ("suppressed:expired", "skipped")
    (again,) = world.evaluate(restarted, "reclaim")
    assert restarted.wait_idle(10)
    assert again.id != decision.id and [d.id for d in world.log.ran] == [again.id]


def test_resume_racing_admission_runs_a_decision_once_after_its_intent(world: World) -> None:
    """A resume between the cycle's commit and the gate's admission runs nothing before its
    intent is written, and admission does not run it a second time (``unfinished()`` reads
    ``audited``). Deterministic: the resume runs inside admission's first step."""
    engine = world.engine()
    admit = engine.gate.admit
    spooled_at_run: list[int] = []
    world.log.fail = lambda d: spooled_at_run.append(len(world.docs())) or None  # type: ignore[func-returns-value]

    def racing(decisions: Any, runs: Any) -> Any:
        engine.gate._resume_unfinished()  # the resume, at the worst instant
        assert engine.gate.wait_idle(10)
        return admit(decisions, runs)

    engine.gate.admit = racing  # type: ignore[method-assign]
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert [d.id for d in world.log.ran] == [decision.id]
    assert spooled_at_run == [1]  # its intent was in the spool when it ran
    engine.gate._submit(decision)  # a late duplicate (a second resume): runs nothing
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1


def test_a_grant_and_its_rerun_are_one_transaction(world: World) -> None:
    """The grant (approval settled, decision set to run) and the rerun with its new verdict
    are one transaction: a failure in it leaves the approval pending, and the grant that
    succeeds, interrupted before the gate, runs once after a restart."""
    from gpuops.runtime.approvals import ApprovalError

    engine = world.engine()
    world.prom.results["approve"] = uuids(1)
    (waiting,) = world.evaluate(engine, "reclaim-approved")
    rerun = engine.store.rerun_decision

    def crash(db: Any, decision: Decision) -> None:
        raise RuntimeError("the disk went away")

    engine.store.rerun_decision = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        engine.grant(waiting.id, "alice")
    engine.store.rerun_decision = rerun  # type: ignore[method-assign]
    approval = engine.store.approval(waiting.id)
    assert approval is not None and approval.status == "pending"
    engine.gate.admit = lambda decisions, runs: {}  # type: ignore[method-assign]  # the crash
    assert engine.grant(waiting.id, "alice").verdict == "execute"
    with pytest.raises(ApprovalError):
        engine.grant(waiting.id, "bob")  # granted once
    engine.stop()
    restarted = world.engine()
    restarted.start()
    assert restarted.wait_idle(10)
    assert [d.id for d in world.log.ran] == [waiting.id]
    assert world.verdicts("reclaim-approved")[-2:] == [("execute", "none"), ("execute", "success")]


def test_a_quota_grant_held_at_the_gate_is_decided_again_when_the_hold_lifts(
    world: World,
) -> None:
    """A quota grant that the kill switch holds at the gate stays ``applying`` (not
    ``failed``) and is applied once the switch is off."""
    engine = world.engine(workers=1)
    _blocked(world, engine)
    request = _quota(engine)
    result: list[Any] = []
    approving = threading.Thread(target=lambda: result.append(engine.quota.approve(request, "a")))
    approving.start()
    wait_for(lambda: engine.gate.in_flight() == 2, 10, "the grant to be queued")
    engine.set_control("kill_switch", True, "ops")
    world.log.gate.set()
    approving.join(10)
    (held,) = result
    assert held.status == "applying" and "kill switch" in (held.error or "")
    engine.quota.tick()  # the switch is still on: nothing decided
    assert world.verdicts("quota-request") == [
        ("execute", "none"),
        ("suppressed:kill_switch", "skipped"),
    ]
    engine.set_control("kill_switch", False, "ops")
    world.clock.now += 61
    engine.quota.tick()
    assert engine.quota.get(request).status == "active"
    assert [d.action.type for d in world.log.ran if d.action] == ["reclaim", "scale_out"]


def test_an_alert_fire_held_at_the_gate_acts_on_the_next_notification(world: World) -> None:
    """An Alertmanager-triggered fire held by the kill switch is decided again when the
    notification is resent (not a duplicate, and a new decision id: not a replay)."""
    engine = world.engine()
    alert = replace(_alert("firing"), fingerprint="f1")
    engine.set_control("kill_switch", True, "ops")
    notifications = iter(range(1, 10))

    def notify() -> None:  # as the inbox's worker takes a notification
        engine.alerts._handle_batch([(next(notifications), alert)])

    notify()
    assert engine.wait_idle(10)
    assert world.verdicts("drain") == [("suppressed:kill_switch", "none")]
    notify()  # resent while the switch is on: held again, a new record
    engine.set_control("kill_switch", False, "ops")
    notify()  # Alertmanager's next notification (repeat_interval)
    assert engine.wait_idle(10)
    assert [d.policy for d in world.log.ran] == ["drain"]
    notify()  # and the one after: a duplicate
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1


def test_a_store_error_marking_outcomes_audited_loses_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outcomes are marked audited in one transaction per batch. When that fails the
    outcome is in the spool all the same, the worker's hooks still run, and reconciliation
    writes it again (same event id) and marks it."""
    engine = world.engine()
    mark = engine.store.mark_audited
    hooked: list[str] = []
    engine.gate.on_outcome(lambda decision, outcome: hooked.append(decision.id))

    def broken(ids: Any, level: Any) -> None:
        if level == Audited.OUTCOME:
            monkeypatch.setattr(engine.store, "mark_audited", mark)
            raise StateError("database is locked")
        mark(ids, level)

    monkeypatch.setattr(engine.store, "mark_audited", broken)
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert [d.id for d in world.log.ran] == [decision.id] and hooked == [decision.id]
    assert world.verdicts("reclaim") == [("execute", "none"), ("execute", "success")]
    assert [s.id for s in engine.store.unaudited()] == [decision.id]
    engine.gate.reconcile()
    assert engine.store.unaudited() == []
    assert [d.id for d in world.log.ran] == [decision.id]  # never run twice


def test_a_listener_error_for_one_outcome_of_a_batch_spares_the_others(world: World) -> None:
    """Outcomes finishing together are audited by one worker, for all of them; a listener's
    error for one of them does not reach the other workers of the batch: each outcome is
    notified and hooked, whatever the others' did."""
    engine = world.engine()
    gate = engine.gate
    write_ahead = gate._audit.write_ahead
    first_write = threading.Event()

    def slow_first_outcome(entries: Any) -> Any:
        if any(o is not None for _, o in entries) and not first_write.is_set():
            first_write.set()  # the next two outcomes queue meanwhile: one batch of two
            wait_for(lambda: len(gate._trail.outcomes._pending) == 2, 10, "two outcomes to queue")
        return write_ahead(entries)

    notified: list[str] = []
    hooked: list[str] = []

    def listener(decision: Decision, outcome: Any) -> None:
        notified.append(decision.id)
        if len(notified) == 2:  # the first of the batch of two
            raise RuntimeError("listener bug")

    gate._audit.write_ahead = slow_first_outcome  # type: ignore[method-assign]
    gate._trail.listener = listener
    gate.on_outcome(lambda decision, outcome: hooked.append(decision.id))
    world.prom.results["idle"] = uuids(3)
    decisions = world.evaluate(engine, "reclaim")
    assert engine.wait_idle(10)
    assert sorted(notified) == sorted(hooked) == sorted(d.id for d in decisions)


def test_reconcile_leaves_an_outcome_waiting_in_the_batch_to_its_worker(world: World) -> None:
    """An outcome stored and waiting for its batch's spool write is not yet marked audited; a
    reconciliation meanwhile (a spool writable again) leaves it to its worker, so the spool
    holds one copy."""
    engine = world.engine()
    gate = engine.gate
    write_ahead = gate._audit.write_ahead
    writing, release = threading.Event(), threading.Event()
    worker = threading.current_thread()

    def held_outcome(entries: Any) -> Any:
        if threading.current_thread() is not worker and any(o is not None for _, o in entries):
            writing.set()
            assert release.wait(10)
        return write_ahead(entries)

    gate._audit.write_ahead = held_outcome  # type: ignore[method-assign]
    world.prom.results["idle"] = uuids(1)
    (decision,) = world.evaluate(engine, "reclaim")
    assert writing.wait(10)  # stored, not yet audited: what reconciliation reads as lacking
    assert [s.id for s in engine.store.unaudited()] == [decision.id]
    assert gate.reconcile() == 0
    release.set()
    assert engine.wait_idle(10)
    assert world.verdicts("reclaim") == [("execute", "none"), ("execute", "success")]
    assert engine.store.unaudited() == []
    # (a failed mark is still reconciled: test_a_store_error_marking_outcomes_audited_...)


def _step(world: World, node: str) -> Decision:
    now = world.clock()
    key = f"node={node}"
    return Decision(
        id=decision_id("ladder-policy", key, now, "ladder:reset_gpu"),
        policy="ladder-policy",
        group="health-ladder",
        target=Target(key=key, labels={"node": node}),
        transition=Transition.FIRE,
        action=ActionSpec("reclaim", "log"),
        evidence=Evidence(
            expr="health ladder: reset_gpu", value=None, pending_since=now, observed_at=now
        ),
        at=now,
        episode_start=now,
        reason=f"remediation ladder: reset_gpu of {node}",
    )


def test_a_step_tried_again_under_the_same_hold_is_told_once(world: World) -> None:
    """A runner retries a held step every tick (the remediation ladder does): the hold is
    audited when it begins and when its reason changes, not at every try; the run is."""
    engine = world.engine()
    step = _step(world, "n1")
    engine.set_control("kill_switch", True, "ops")
    for _ in range(5):
        assert engine.gate.run_step(step).status is OutcomeStatus.SKIPPED
    assert [v for v, _ in world.verdicts("ladder-policy")] == ["suppressed:kill_switch"]
    engine.set_control("kill_switch", False, "ops")
    for _ in range(3):
        assert engine.gate.run_step(step, dry_run=True).status is OutcomeStatus.SKIPPED
    assert engine.gate.run_step(step).ok
    assert world.verdicts("ladder-policy") == [
        ("suppressed:kill_switch", "skipped"),
        ("dry_run", "skipped"),
        ("execute", "none"),
        ("execute", "success"),
    ]
    assert len(world.log.ran) == 1
