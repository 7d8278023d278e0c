"""Noise that hides signal: what the engine records when nothing happens.

A clear with nothing to undo is state only; the kill switch and pause hold back nothing that
would not run; a suppression that re-decides every minute is recorded once, counted, and still
explained. Uses the runtime fixture of test_runtime (fake Prometheus,
recording executor, injected clock)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpuops.api.routes.decisions import explain_decision
from gpuops.audit.anomalies import AnomalySettings, find_anomalies
from gpuops.audit.search import SpoolBackend
from gpuops.model.decisions import ActionSpec, Decision, Evidence, Target, Transition
from gpuops.runtime import Engine
from gpuops.sim.demo_report import DemoReport
from tests.unit.runtime.test_runtime import RULES, audit_docs, cycle, make  # noqa: F401

POPULATION = 'group by (uuid) (util{uuid!=""})'


def _clears(root: Path) -> list[dict[str, Any]]:
    return [d for d in audit_docs(root) if d["gpuops"]["transition"] == "clear"]


def _suppressed(engine: Engine, reason: str) -> float:
    value = engine.metrics.registry.get_sample_value(
        "gpuops_engine_suppressed_total", {"policy": "reclaim", "reason": reason}
    )
    return value or 0.0


def _explain(engine: Engine, decision_id: str) -> dict[str, Any]:
    """The explanation as ``GET /decisions/{id}/explain`` serves it (JSON)."""
    ctx: Any = SimpleNamespace(engine=engine)
    result: dict[str, Any] = explain_decision(decision_id, ctx, None).model_dump(mode="json")  # type: ignore[arg-type]
    return result


def test_a_clear_without_on_clear_is_neither_stored_nor_audited(make) -> None:  # noqa: F811
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (fire,) = cycle(engine, 60)
    make.prom.results["util < 0.2"] = []
    (clear,) = cycle(engine, 10)
    assert clear.transition.value == "clear" and clear.action is None
    assert engine.store.decision(clear.id) is None
    engine.audit.close()
    assert _clears(make.dir) == []
    assert engine.store.policy_state("reclaim").targets == {}  # the state did clear
    assert [d["gpuops"]["decision"]["id"] for d in audit_docs(make.dir)] == [fire.id, fire.id]


def test_flapping_without_on_clear_is_still_found_from_the_fires(make) -> None:  # noqa: F811
    engine = make()
    for _ in range(3):  # three episodes, their clears unrecorded
        make.prom.results["util < 0.2"] = [{"uuid": "a"}]
        cycle(engine, 3600)  # past the cooldown
        cycle(engine, 60)
        make.prom.results["util < 0.2"] = []
        cycle(engine, 10)
    engine.audit.close()
    assert _clears(make.dir) == []
    window = AnomalySettings(since=0, until=make.clock.now + 3600)
    found = find_anomalies(SpoolBackend(make.dir / "audit"), window)
    assert [(f.check, f.keys, f.count) for f in found if f.check == "flapping_policy"] == [
        ("flapping_policy", {"policy": "reclaim", "target": "uuid=a"}, 3)
    ]


def test_under_the_kill_switch_or_pause_a_clear_with_nothing_to_undo_is_not_held(
    make,  # noqa: F811
) -> None:
    engine = make()
    for control in ("kill_switch", "paused"):
        engine.set_control(control, True, "ops")
        make.prom.results["util < 0.2"] = [{"uuid": control}]
        cycle(engine, 100)
        (fire,) = cycle(engine, 60)
        assert fire.verdict == f"suppressed:{control}"
        make.prom.results["util < 0.2"] = []
        (clear,) = cycle(engine, 10)
        assert clear.verdict == "execute" and clear.action is None
        engine.set_control(control, False, "ops")
    engine.audit.close()
    assert _clears(make.dir) == []
    verdicts = [d["gpuops"]["verdict"] for d in audit_docs(make.dir) if "gpuops" in d]
    assert verdicts == ["suppressed:kill_switch", "suppressed:paused"]
    assert make.ran == []


def test_a_target_held_by_max_fraction_is_recorded_once_and_counted(
    make,  # noqa: F811
    tmp_path: Path,
) -> None:
    rules = RULES.replace("cooldown: 1h", "limits: {max_fraction: 0.25}")
    (tmp_path / "rules" / "p.yaml").write_text(rules)
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": u} for u in "abc"]
    make.prom.results[POPULATION] = [{"uuid": f"{i}"} for i in range(8)]
    cycle(engine)
    decisions = cycle(engine, 60)
    (held,) = [d for d in decisions if d.suppressed]
    assert held.verdict == "suppressed:max_fraction"
    for _ in range(10):  # decided again every minute (RETRY_S), recorded once
        (again,) = cycle(engine, 60)
        assert again.target == held.target and again.verdict == held.verdict
        assert engine.store.decision(again.id) is None
    assert _suppressed(engine, "max_fraction") == 11
    explained = _explain(engine, held.id)
    suppression = explained["guardrails"]["suppression"]
    assert suppression["current"] is True and suppression["repeats"] == 10
    assert suppression["since"] == held.at
    assert "still held now: suppressed:max_fraction since" in explained["explanation"][-1]
    assert "decided again 10 times" in explained["explanation"][-1]

    engine.stop()
    restarted = make()  # the count survives a restart (it is the policy's state)
    (again,) = cycle(restarted, 60)
    assert restarted.store.decision(again.id) is None

    restarted.set_control("kill_switch", True, "ops")  # the reason changes: a new record
    (switched,) = cycle(restarted, 60)
    assert switched.verdict == "suppressed:kill_switch" and switched.held_repeats == 11
    stored = restarted.store.decision(switched.id)
    assert stored is not None and stored.decision.held_repeats == 11
    assert "11 unrecorded repeats" in _explain(restarted, switched.id)["explanation"][-1]
    assert _explain(restarted, held.id)["guardrails"]["suppression"]["current"] is False
    cycle(restarted, 60)  # kill switch still on: a repeat

    restarted.set_control("kill_switch", False, "ops")
    make.prom.results[POPULATION] = [{"uuid": f"{i}"} for i in range(12)]  # room for a third
    (acted,) = cycle(restarted, 60)
    assert acted.verdict == "execute" and acted.held_repeats == 1
    assert acted.id in {d.id for d in make.ran}
    restarted.audit.close()
    docs = [d for d in audit_docs(make.dir) if d["gpuops"]["target"]["key"] == held.target.key]
    verdicts = [d["gpuops"]["verdict"] for d in docs]
    assert verdicts == ["suppressed:max_fraction", "suppressed:kill_switch", "execute", "execute"]
    assert docs[1]["gpuops"]["decision"]["held_repeats"] == 11
    assert "held_repeats" not in docs[0]["gpuops"]["decision"]


def test_an_undo_held_by_the_kill_switch_is_recorded_once_then_runs(
    make,  # noqa: F811
    tmp_path: Path,
) -> None:
    with_undo = RULES.replace("cooldown: 1h", "on_clear: {type: restore, executor: log}", 1)
    (tmp_path / "rules" / "p.yaml").write_text(with_undo)
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "u"}]
    cycle(engine)
    cycle(engine, 60)
    engine.set_control("kill_switch", True, "ops")
    make.prom.results["util < 0.2"] = []
    retries = [cycle(engine, 60) for _ in range(4)]  # the first clear, then three retries
    assert all(d.verdict == "suppressed:kill_switch" for (d,) in retries)
    assert [engine.store.decision(d.id) is not None for (d,) in retries] == [
        True,
        False,
        False,
        False,
    ]
    explained = _explain(engine, retries[0][0].id)["guardrails"]["suppression"]
    assert explained["current"] is True and explained["repeats"] == 3
    engine.set_control("kill_switch", False, "ops")
    (ran,) = cycle(engine, 60)
    assert ran.verdict == "execute" and ran.held_repeats == 3
    assert [d.action.type for d in make.ran if d.action] == ["reclaim", "restore"]
    assert engine.store.policy_state("reclaim").targets == {}
    engine.audit.close()
    clears = [(d["gpuops"]["verdict"], d["event"]["type"]) for d in _clears(make.dir)]
    assert clears == [
        ("suppressed:kill_switch", ["info"]),
        ("execute", ["info"]),
        ("execute", ["change"]),
    ]


def test_the_demo_summary_counts_the_unrecorded_repeats() -> None:
    def decision(verdict: str, held_repeats: int = 0) -> Decision:
        return Decision(
            id=verdict,
            policy="migrate-off-down-nodes",
            group="g",
            target=Target("node=n1", {"node": "n1"}),
            transition=Transition.FIRE,
            action=ActionSpec("migrate", "fleet"),
            evidence=Evidence("up == 0", 0.0, 1.0, 2.0),
            at=2.0,
            episode_start=1.0,
            verdict=verdict,
            held_repeats=held_repeats,
        )

    report = DemoReport()
    report.add(decision("suppressed:max_fraction"), None)
    assert "decided them again" not in report.summary(60)
    report.add(decision("suppressed:kill_switch", held_repeats=3), None)
    report.add_repeats(2)  # still held at the end
    assert "the engine decided them again 5 times without new records" in report.summary(60)
