"""The runtime with fakes at our own boundary, built by ``tests.builders``: a scripted
Prometheus client, a recording executor and an injected clock. Covers persistence, replays,
controls, approvals, alerts and live reload (a reload's PromQL checked by promtool:
tests/integration/runtime/test_reload_promql.py); the real loop is in tests/e2e. Every test
runs with both kinds of client (tests/fakes/prometheus.py): one that answers ``query`` with
tuples (the cycle's general path, as with the what-if's client) and a ``PrometheusClient``
whose answers go through the real decoder as columns (the path against a real Prometheus:
``query_vector``, the steady path)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import TemporaryError
from gpuops.actions.fleet import FleetExecutor
from gpuops.audit.spool import read_spool
from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import Decision
from gpuops.model.evaluation import evaluator as evaluation
from gpuops.runtime import Engine
from gpuops.runtime.approvals import ApprovalError
from gpuops.runtime.cycle import clears as cycle_module
from gpuops.settings import GuardrailSettings
from gpuops.store.sql.policy_seen import REFRESH_S
from tests.builders import Clock, build_engine, write_rules
from tests.fakes.executors import Recorder
from tests.fakes.prometheus import FakePrometheus, FakePrometheusClient

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - policy: reclaim
        expr: util < 0.2
        for: 60s
        target: [uuid]
        action: {type: reclaim, executor: log}
        cooldown: 1h
        mode: enforce
      - policy: drain
        trigger: {alertmanager: {alertname: GPUFellOffBus}}
        target: [node]
        action: {type: migrate, executor: log}
        on_clear: {type: restore, executor: log}
        mode: enforce
"""


def done(decision: Decision) -> Mapping[str, Any]:
    return {"done": decision.action.type if decision.action else ""}


@dataclass
class Make:
    """Builds engines on one directory (a restart is another ``make()``) with one fake
    Prometheus, one recording executor and one clock; ``make(**guardrails)``."""

    dir: Path
    prom: FakePrometheus | FakePrometheusClient
    clock: Clock = field(default_factory=Clock)
    log: Recorder = field(default_factory=lambda: Recorder("log", result=done))
    engines: list[Engine] = field(default_factory=list)

    @property
    def ran(self) -> list[Decision]:
        return self.log.ran

    def __call__(self, **guardrails: Any) -> Engine:
        engine = build_engine(
            self.dir,
            source=self.prom,
            clock=self.clock,
            executors={"log": self.log},
            guardrails=GuardrailSettings(**guardrails),
        )
        self.engines.append(engine)
        return engine


@pytest.fixture(params=["tuples", "vector"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    prom = FakePrometheusClient() if request.param == "vector" else FakePrometheus()
    write_rules(tmp_path, RULES)
    made = Make(tmp_path, prom)
    yield made
    for engine in made.engines:
        engine.stop()


def cycle(engine: Engine, seconds: float = 0) -> list[Decision]:
    engine.clock.now += seconds  # type: ignore[attr-defined]
    policy = engine.rules.policy("reclaim")
    assert policy is not None
    decisions = engine.evaluate_policy(policy)
    assert engine.wait_idle(10)
    return decisions


def audit_docs(root: Path) -> list[dict[str, Any]]:
    return list(read_spool(root / "audit"))


def test_fires_after_for_and_audits_the_outcome(make) -> None:
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    assert cycle(engine) == []
    (decision,) = cycle(engine, 60)
    assert decision.verdict == "execute"
    assert [d.id for d in make.ran] == [decision.id]
    stored = engine.store.decision(decision.id)
    assert stored is not None and stored.outcome is not None and stored.outcome.ok
    engine.audit.close()
    docs = [d for d in audit_docs(make.dir) if d.get("rule", {}).get("name") == "reclaim"]
    # write-ahead: the intent (verdict, no outcome yet) is in the spool before the outcome
    assert [(d["gpuops"]["verdict"], d["event"]["outcome"]) for d in docs] == [
        ("execute", "unknown"),
        ("execute", "success"),
    ]


def test_state_survives_a_new_engine_on_the_same_file(make) -> None:
    first = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(first, 0)
    cycle(first, 30)
    first.stop()
    second = make()
    (decision,) = cycle(second, 30)  # 60 s after the target appeared, not 60 s after restart
    assert decision.evidence.pending_since == make.clock.now - 60
    assert cycle(second, 30) == []  # firing: no second action
    assert len(make.ran) == 1


def test_query_failure_changes_nothing_and_is_audited(make) -> None:
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    before = engine.store.policy_state("reclaim")
    make.prom.results["util < 0.2"] = RuntimeError("connection refused")
    assert cycle(engine, 60) == []
    after = engine.store.policy_state("reclaim")
    # the timer is kept; only where the stretch without fresh data began is noted
    assert after.targets == {
        k: replace(t, absent_since=1_000_060.0) for k, t in before.targets.items()
    }
    assert make.ran == []
    engine.audit.close()
    skipped = [d for d in audit_docs(make.dir) if "connection refused" in json.dumps(d)]
    assert skipped


def test_kill_switch_file_suppresses_and_audits(make, tmp_path: Path) -> None:
    kill = tmp_path / "KILL"
    engine = make(kill_switch_file=kill)
    kill.touch()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (decision,) = cycle(engine, 60)
    assert decision.verdict == "suppressed:kill_switch"
    assert make.ran == []


def test_pause_is_persisted(make) -> None:
    engine = make()
    engine.set_control("paused", True, "alice")
    engine.stop()
    again = make()
    assert again.paused()
    again.set_control("paused", False, "alice")
    assert not again.paused()
    with pytest.raises(ValueError, match="unknown control"):
        again.set_control("nap", True, "alice")


def test_approval_grant_runs_the_action_once(make, tmp_path: Path) -> None:
    (tmp_path / "rules" / "p.yaml").write_text(RULES.replace("cooldown: 1h", "approval: required"))
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (decision,) = cycle(engine, 60)
    assert decision.verdict == "awaiting_approval"
    assert [a.decision_id for a in engine.store.approvals("pending")] == [decision.id]
    granted = engine.grant(decision.id, "admin")
    engine.wait_idle(10)
    assert granted.verdict == "execute" and "approved by admin" in granted.reason
    assert [d.id for d in make.ran] == [decision.id]
    with pytest.raises(ApprovalError, match="granted, not pending"):
        engine.grant(decision.id, "admin")


def test_approval_expires(make, tmp_path: Path) -> None:
    (tmp_path / "rules" / "p.yaml").write_text(RULES.replace("cooldown: 1h", "approval: required"))
    engine = make(approval_ttl=300)
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (decision,) = cycle(engine, 60)
    make.clock.now += 301
    (expired,) = engine.expire_approvals()
    assert expired.verdict == "suppressed:approval_expired"
    with pytest.raises(ApprovalError):
        engine.deny(decision.id, "admin")
    assert make.ran == []


def test_alert_fires_once_per_episode_and_resolves_with_on_clear(make) -> None:
    engine = make()
    alert = Alert(
        fingerprint="abc",
        status=AlertStatus.FIRING,
        labels={"alertname": "GPUFellOffBus", "node": "n1", "instance": "x"},
        starts_at="2026-11-30T08:00:00Z",
    )
    (fired,) = engine.handle_alert(alert)
    again = engine.handle_alert(alert)  # Alertmanager retried the webhook
    engine.wait_idle(10)
    assert fired.target.labels == {"node": "n1"}
    assert [d.id for d in again] == [fired.id]
    (cleared,) = engine.handle_alert(replace(alert, status=AlertStatus.RESOLVED))
    engine.wait_idle(10)
    assert [d.action.type for d in make.ran if d.action] == ["migrate", "restore"]
    assert cleared.transition.value == "resolve"
    other = engine.handle_alert(replace(alert, labels={"alertname": "Other", "node": "n1"}))
    assert other == []


ITEM: dict[str, Any] = {
    "status": "firing",
    "labels": {"alertname": "GPUFellOffBus", "node": "n1", "instance": "x"},
    "annotations": {"summary": "fell off the bus"},
    "startsAt": "2026-11-30T08:00:00Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "generatorURL": "http://prometheus/graph",
    "fingerprint": "abc",
}


def test_handle_alert_takes_the_alertmanager_item_as_a_mapping(make) -> None:
    """As before the model's Alert: a caller that hands the item as Alertmanager sends it gets
    the same decisions as with the Alert the receiver builds (same ids: the same episode)."""
    engine = make()
    (fired,) = engine.handle_alert(ITEM)
    again = engine.handle_alert(
        Alert(
            fingerprint="abc",
            status=AlertStatus.FIRING,
            labels={"alertname": "GPUFellOffBus", "node": "n1", "instance": "x"},
            starts_at="2026-11-30T08:00:00Z",
        )
    )
    engine.wait_idle(10)
    assert fired.target.labels == {"node": "n1"}
    assert [d.id for d in again] == [fired.id]
    (cleared,) = engine.handle_alert({**ITEM, "status": "resolved"})
    engine.wait_idle(10)
    assert [d.action.type for d in make.ran if d.action] == ["migrate", "restore"]
    assert cleared.transition.value == "resolve"


def test_a_mapping_becomes_the_alert_the_receiver_builds() -> None:
    from gpuops.api.schemas import Alert as AlertItem
    from gpuops.runtime.facade import alert_of

    built = alert_of(ITEM)
    assert built == AlertItem.model_validate(ITEM).value()
    assert alert_of(built) is built


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"status": "pending"}, "status"),
        ({"fingerprint": ""}, "fingerprint"),
        ({"labels": {"node": 1}}, "labels.node"),
        ({"startsAt": "x" * 65}, "startsAt"),
    ],
)
def test_handle_alert_refuses_a_mapping_the_receiver_would(
    make, change: dict[str, Any], named: str
) -> None:
    engine = make()
    with pytest.raises(ValueError, match=f"not an Alertmanager alert: .*{named}"):
        engine.handle_alert({**ITEM, **change})
    assert make.ran == []


def test_handle_alert_names_what_a_mapping_lacks(make) -> None:
    engine = make()
    item = {k: v for k, v in ITEM.items() if k != "fingerprint"}
    with pytest.raises(ValueError, match="fingerprint: Field required"):
        engine.handle_alert(item)


def test_invalid_edit_keeps_the_running_rules(make, tmp_path: Path) -> None:
    engine = make()
    rule_file = tmp_path / "rules" / "p.yaml"
    rule_file.write_text(RULES.replace("for: 60s", "for: sixty"))
    result = engine.reload()
    assert not result.ok
    assert any(f"{rule_file}:" in e and "invalid duration" in e for e in result.errors)
    policy = engine.rules.policy("reclaim")
    assert policy is not None and policy.for_s == 60
    rule_file.write_text(RULES.replace("for: 60s", "for: 2m"))
    engine.check_reload()  # changed: read again at the next check
    policy = engine.rules.policy("reclaim")
    assert policy is not None and policy.for_s == 60
    engine.check_reload()  # the same twice in a row: reloaded
    policy = engine.rules.policy("reclaim")
    assert policy is not None and policy.for_s == 120


def test_scheduled_policies_run_on_their_cron_job_only(make, tmp_path: Path) -> None:
    scheduled = RULES.replace("        for: 60s\n", '        schedule: "*/5 22-23 * * *"\n')
    (tmp_path / "rules" / "p.yaml").write_text(scheduled)
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    group = engine.rules.groups[0]
    engine.evaluate_group(group)  # the group interval skips a scheduled policy
    assert engine.store.policy_state("reclaim").targets == {}
    engine.evaluate_group(group, scheduled=True)  # what its cron job runs
    assert list(engine.store.policy_state("reclaim").targets) == ["uuid=a"]


def test_scheduled_group_runs_evaluate_at_their_grid_point(make) -> None:
    """A run that starts late still evaluates at its grid time, so `for` is met after exactly
    `for` seconds of schedule, as in Prometheus."""
    engine = make()
    group = engine.rules.groups[0]  # interval 10s; reclaim has for: 60s
    engine.cycle.epochs[group.name] = make.clock.now
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    engine.evaluate_group(group)
    for _ in range(6):
        make.clock.now += 9.997  # the scheduler woke a little early each time
        engine.evaluate_group(group)
    engine.wait_idle(10)
    assert len(make.ran) == 1
    (decision,) = make.ran
    assert decision.evidence.pending_since + 60 == decision.at


def test_a_verb_the_executor_does_not_do_is_a_rule_error(make, tmp_path: Path) -> None:
    engine = make()
    engine.registry.register("fleet", FleetExecutor)
    rule_file = tmp_path / "rules" / "p.yaml"
    rule_file.write_text(
        RULES.replace("{type: reclaim, executor: log}", "{type: reclaimm, executor: fleet}")
    )
    result = engine.reload()
    assert not result.ok
    assert FleetExecutor.verbs is not None and "reclaim" in FleetExecutor.verbs
    assert result.errors == (
        f"{rule_file}:10: groups[0].rules[0].action.type: executor 'fleet' does not do "
        f"'reclaimm' (it does: {', '.join(sorted(FleetExecutor.verbs))})",
    )


def test_an_action_interrupted_by_a_crash_runs_at_start(make) -> None:
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    policy = engine.rules.policy("reclaim")
    assert policy is not None
    engine.gate._submit = lambda decision: None  # type: ignore[method-assign]  # the crash: `started`, never run
    (decision,) = engine.evaluate_policy(policy, make.clock.now + 60)
    assert [d.id for d in engine.store.unfinished()] == [decision.id]
    engine.stop()
    restarted = make()
    restarted.start()
    assert restarted.wait_idle(10)
    assert [d.id for d in make.ran] == [decision.id]
    assert restarted.store.unfinished() == []


def test_max_fraction_without_target_counts_the_targets_labels(make, tmp_path: Path) -> None:
    rules = RULES.replace("        target: [uuid]\n", "").replace(
        "cooldown: 1h", "limits: {max_fraction: 0.25}"
    )
    (tmp_path / "rules" / "p.yaml").write_text(rules)
    engine = make()
    down = [{"node": f"n{i}", "job": "gpu-nodes"} for i in range(3)]
    make.prom.results["util < 0.2"] = down
    make.prom.results['group by (job, node) (util{job!="",node!=""})'] = [
        {"node": f"n{i}", "job": "gpu-nodes"} for i in range(8)
    ]
    cycle(engine)
    decisions = cycle(engine, 60)
    verdicts = sorted(d.verdict for d in decisions)
    assert verdicts == ["execute", "execute", "suppressed:max_fraction"]  # 25% of 8 nodes


def test_the_population_is_counted_by_prometheus_once_per_evaluation_time(
    make, tmp_path: Path
) -> None:
    """Prometheus counts the population (not every target's series fetched), once per
    evaluation time and query, whatever number of policies decided."""
    twin = RULES.split("      - policy: drain")[0].replace("policy: reclaim", "policy: reclaim-b")
    rules = (RULES + twin.split("rules:\n", 1)[1]).replace(
        "cooldown: 1h", "limits: {max_fraction: 0.5}"
    )
    (tmp_path / "rules" / "p.yaml").write_text(rules)
    engine = make()
    population = 'group by (uuid) (util{uuid!=""})'
    make.prom.results["util < 0.2"] = [{"uuid": f"GPU-{i}"} for i in range(3)]
    make.prom.results[population] = [{"uuid": f"GPU-{i}"} for i in range(4)]
    group = engine.rules.groups[0]
    engine.evaluate_group(group)
    make.clock.now += 60
    engine.evaluate_group(group)
    assert engine.wait_idle(10)
    asked = [q for q in make.prom.queries if "uuid!=" in q]
    # both policies decided at the same time: one count; the gate counts again for each of the
    # 4 actions it runs (at execution, never a reused count)
    assert asked == [f"count({population})"] * 5
    assert len(make.ran) == 4  # 2 of 3 targets per policy: 50% of the 4 counted
    verdicts = [d.decision.verdict for d in engine.store.decisions(limit=10)]
    assert sorted(verdicts) == ["execute"] * 4 + ["suppressed:max_fraction"] * 2  # 50% of 4


def test_a_population_count_is_reused_for_its_evaluation_time_only(make, tmp_path: Path) -> None:
    """A count is reused only for the evaluation time it was made at, so a rack that died
    (its series gone from results at once) no longer counts at the next: any other time, and
    every recheck by the gate, asks again, and a failed query is None (it holds the
    action)."""
    rules = RULES.replace("cooldown: 1h", "limits: {max_fraction: 0.5}")
    (tmp_path / "rules" / "p.yaml").write_text(rules)
    engine = make()
    population = 'group by (uuid) (util{uuid!=""})'
    make.prom.results[population] = [{"uuid": f"GPU-{i}"} for i in range(10)]
    policy = engine.rules.policy("reclaim")
    assert policy is not None
    start = make.clock.now

    def counted() -> int:
        return sum(1 for q in make.prom.queries if q == f"count({population})")

    assert engine.cycle.population(policy, start) == 10
    make.prom.results[population] = [{"uuid": f"GPU-{i}"} for i in range(4)]  # a rack died
    assert engine.cycle.population(policy, start) == 10  # the same evaluation time: reused
    assert engine.cycle.population(policy, start, reuse=False) == 4  # the gate: counted
    assert engine.cycle.population(policy, start + 1) == 4  # a later time: counted
    make.prom.results[population] = Exception("Prometheus unreachable")
    assert engine.cycle.population(policy, start + 1, reuse=False) is None
    assert engine.cycle.population(policy, start + 2) is None
    assert counted() == 5


def test_clear_expr_is_asked_only_for_the_firing_targets(make, tmp_path: Path) -> None:
    """``clear_expr`` is asked only for the firing targets (their values matched, escaped),
    not for the whole fleet, and a target it matches clears."""
    rules = RULES.replace("        cooldown: 1h\n", "        clear_expr: util > 0.5\n", 1)
    (tmp_path / "rules" / "p.yaml").write_text(rules.replace("for: 60s", "for: 0s"))
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": 'GPU-"1'}, {"uuid": "GPU-2"}]
    assert len(cycle(engine)) == 2  # both fire
    make.prom.results["util < 0.2"] = []
    narrowed = '(util{uuid=~"GPU-\\"1|GPU-2"}) > (0.5)'
    make.prom.results[narrowed] = [{"uuid": "GPU-2"}]
    decided = cycle(engine, 10)
    (cleared,) = decided
    assert cleared.transition == "clear" and cleared.target.key == "uuid=GPU-2"
    assert "util > 0.5" not in make.prom.queries  # never the wide query
    assert make.prom.queries.count(narrowed) == 1


def test_a_group_is_stored_in_one_transaction_and_its_intents_in_one_spool_write(
    make, tmp_path: Path
) -> None:
    """One transaction (one fsync) and one intent write per group run, not per policy
    (group commit). That the intents are durable before any action runs is the gate's
    (tests/unit/runtime/test_gate.py)."""
    twin = RULES.split("      - policy: drain")[0].replace("policy: reclaim", "policy: reclaim-b")
    (tmp_path / "rules" / "p.yaml").write_text(RULES + twin.split("rules:\n", 1)[1])
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": f"GPU-{i}"} for i in range(3)]
    group = engine.rules.groups[0]
    engine.evaluate_group(group)
    transactions: list[int] = []
    writes: list[list[str]] = []
    store_transaction, write_ahead = engine.store.transaction, engine.audit.write_ahead

    def transaction():  # type: ignore[no-untyped-def]
        transactions.append(1)
        return store_transaction()

    def written(entries):  # type: ignore[no-untyped-def]
        writes.append([d.policy for d, outcome in entries if outcome is None])
        return write_ahead(entries)

    engine.store.transaction = transaction  # type: ignore[method-assign]
    engine.audit.write_ahead = written  # type: ignore[method-assign]
    engine.gate._submit = lambda decision: None  # type: ignore[method-assign]  # count the cycle only
    make.clock.now += 60
    engine.evaluate_group(group)
    assert len(transactions) == 2  # the group's states and decisions; the intents' audited mark
    assert [sorted(set(w)) for w in writes] == [["reclaim", "reclaim-b"]]
    assert len(writes[0]) == 6  # 3 targets x 2 policies


def test_an_exported_policy_alert_routed_back_acts(make) -> None:
    """`gpuops rules export` alerts carry gpuops_policy: Prometheus evaluates, the engine acts."""
    engine = make()
    alert = Alert(
        fingerprint="",
        status=AlertStatus.FIRING,
        labels={"alertname": "reclaim", "gpuops_policy": "reclaim", "uuid": "GPU-1"},
        starts_at="2026-11-30T08:00:00Z",
    )
    (decision,) = engine.handle_alert(alert)
    engine.wait_idle(10)
    assert decision.policy == "reclaim" and decision.target.labels == {"uuid": "GPU-1"}
    assert [d.action.type for d in make.ran if d.action] == ["reclaim"]
    assert engine.handle_alert(replace(alert, labels={**alert.labels, "gpuops_policy": "x"})) == []


def test_cooldown_then_the_same_episode_acts_when_it_ends(make) -> None:
    """A target idle again within the cooldown is reclaimed when the cooldown ends."""
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (first,) = cycle(engine, 60)
    make.prom.results["util < 0.2"] = []
    cycle(engine, 10)  # cleared
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine, 10)
    (held,) = cycle(engine, 60)
    assert held.verdict == "suppressed:cooldown"
    for _ in range(20):  # 1h cooldown from the first action, evaluated every 3 minutes
        cycle(engine, 180)
    assert [d.verdict for d in make.ran] == ["execute", "execute"]
    assert make.ran[1].at >= first.at + 3600


def test_an_undo_held_by_the_kill_switch_runs_when_it_is_off(make, tmp_path: Path) -> None:
    undo = "cooldown: 1h\n        on_clear: {type: restore, executor: log}"
    (tmp_path / "rules" / "p.yaml").write_text(RULES.replace("cooldown: 1h", undo, 1))
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    cycle(engine, 60)
    engine.set_control("kill_switch", True, "ops")
    make.prom.results["util < 0.2"] = []
    (clear,) = cycle(engine, 10)
    assert clear.verdict == "suppressed:kill_switch" and clear.action is not None
    engine.set_control("kill_switch", False, "ops")
    cycle(engine, 30)  # before the retry time: nothing yet
    cycle(engine, 60)
    assert [d.action.type for d in make.ran if d.action] == ["reclaim", "restore"]


def test_an_approval_pending_when_the_condition_clears_is_cancelled(make, tmp_path: Path) -> None:
    (tmp_path / "rules" / "p.yaml").write_text(RULES.replace("cooldown: 1h", "approval: required"))
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (waiting,) = cycle(engine, 60)
    make.prom.results["util < 0.2"] = []
    (clear,) = cycle(engine, 10)
    assert clear.action is None  # the action never ran: nothing to undo
    assert engine.store.approval(waiting.id).status == "cancelled"
    with pytest.raises(ApprovalError, match="cancelled, not pending"):
        engine.grant(waiting.id, "admin")
    assert make.ran == []


def test_clears_cancel_each_of_their_approvals_and_no_other_policys(make, tmp_path: Path) -> None:
    """Two targets cleared in one judgement have both their waiting approvals cancelled (not
    only the first's: else an admin could grant the fire of a cleared target), and another
    policy's approval for the same target stays pending."""
    other = (
        "      - policy: reclaim2\n        expr: util2 < 0.2\n        for: 60s\n"
        "        target: [uuid]\n        action: {type: reclaim, executor: log}\n"
        "        approval: required\n        mode: enforce\n"
    )
    rules = RULES.replace("cooldown: 1h", "approval: required").replace(
        "      - policy: drain", other + "      - policy: drain"
    )
    (tmp_path / "rules" / "p.yaml").write_text(rules)
    engine = make()
    second = engine.rules.policy("reclaim2")
    assert second is not None
    make.prom.results["util < 0.2"] = [{"uuid": "a"}, {"uuid": "b"}]
    make.prom.results["util2 < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    engine.evaluate_policy(second)
    waiting = cycle(engine, 60)
    (kept,) = engine.evaluate_policy(second)
    assert len(waiting) == 2 and {d.verdict for d in [*waiting, kept]} == {"awaiting_approval"}
    make.prom.results["util < 0.2"] = []
    clears = cycle(engine, 10)
    assert sorted(d.target.key for d in clears) == ["uuid=a", "uuid=b"]
    assert [engine.store.approval(d.id).status for d in waiting] == ["cancelled", "cancelled"]
    assert engine.store.approval(kept.id).status == "pending"
    for d in waiting:
        with pytest.raises(ApprovalError, match="cancelled, not pending"):
            engine.grant(d.id, "admin")
    engine.grant(kept.id, "admin")
    assert engine.wait_idle(10)
    assert [(d.policy, d.target.key) for d in make.ran] == [("reclaim2", "uuid=a")]


def test_old_decisions_are_pruned(make) -> None:
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (done,) = cycle(engine, 60)
    make.clock.now += 31 * 86400
    engine.prune()
    assert engine.store.decision(done.id) is None


def test_a_failed_action_is_decided_again_while_the_target_still_fires(make) -> None:
    engine = make()
    attempts: list[str] = []

    class Flaky:
        name = "log"
        verbs: frozenset[str] | None = None

        def run(self, decision: Decision) -> Mapping[str, Any]:
            attempts.append(decision.id)
            if len(attempts) <= 3:  # the first decision's three tries
                raise TemporaryError("fleet API answered 503")
            return {"ok": True}

    engine.registry.register("log", lambda settings: Flaky())
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    cycle(engine)
    (first,) = cycle(engine, 60)
    assert engine.store.decision(first.id).outcome.status == "failure"
    assert cycle(engine, 30) == []  # before the retry time
    (second,) = cycle(engine, 40)
    assert second.verdict == "execute" and second.id != first.id
    assert engine.store.decision(second.id).outcome.status == "success"
    assert len(attempts) == 4


def test_a_resolved_alert_undoes_nothing_when_its_action_did_not_run(make) -> None:
    engine = make()
    engine.set_control("kill_switch", True, "ops")
    alert = Alert(
        fingerprint="",
        status=AlertStatus.FIRING,
        labels={"alertname": "GPUFellOffBus", "node": "n1"},
        starts_at="2026-11-30T08:00:00Z",
    )
    (fired,) = engine.handle_alert(alert)
    assert fired.verdict == "suppressed:kill_switch"
    engine.set_control("kill_switch", False, "ops")
    (resolved,) = engine.handle_alert(replace(alert, status=AlertStatus.RESOLVED))
    engine.wait_idle(10)
    assert resolved.action is None and "nothing to undo" in resolved.reason
    assert make.ran == []


def test_max_fraction_of_a_target_without_labels_lets_it_act(make, tmp_path: Path) -> None:
    rules = RULES.replace("        target: [uuid]\n", "").replace(
        "cooldown: 1h", "limits: {max_fraction: 0.1}"
    )
    (tmp_path / "rules" / "p.yaml").write_text(rules)
    engine = make()
    make.prom.results["util < 0.2"] = [{}]  # e.g. sum(x) > 10: one series, no labels
    cycle(engine)
    (decision,) = cycle(engine, 60)
    assert decision.verdict == "execute"


def test_every_minute_with_repeat_interval_1m_acts_every_minute(make, tmp_path: Path) -> None:
    """The cron job wakes a few milliseconds after each minute, unevenly; a run is evaluated
    at its cron time, so 1m after the last action is never 59.99 s."""
    every_minute = RULES.replace(
        "        for: 60s\n", '        schedule: "* * * * *"\n        repeat_interval: 1m\n'
    ).replace("        cooldown: 1h\n", "")
    (tmp_path / "rules" / "p.yaml").write_text(every_minute)
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "a"}]
    (group,) = engine.rules.groups
    at_0817 = 1_796_113_020.0  # a whole minute (08:17:00 UTC)
    for minute, late in enumerate([0.050, 0.010, 0.030, 0.002, 0.040, 0.001, 0.020]):
        make.clock.now = at_0817 + 60 * minute + late
        engine.evaluate_group(group, scheduled=True)
        assert engine.wait_idle(10)
    assert [d.at - at_0817 for d in make.ran] == [0, 60, 120, 180, 240, 300, 360]


def _count_steady(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(policy, whether the evaluation took its steady path) for each evaluation from now on."""
    taken: list[tuple[str, bool]] = []
    steady = evaluation._steady

    def spy(policy, *args):  # type: ignore[no-untyped-def]
        step = steady(policy, *args)
        taken.append((policy.name, step is not None))
        return step

    monkeypatch.setattr(evaluation, "_steady", spy)
    return taken


@pytest.mark.parametrize("make", ["vector"], indirect=True)
def test_policies_with_the_same_expr_share_its_answer_and_steady_evaluations_refresh_rows(
    make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the client's own decoding: a group run asks an expr once for all its
    policies, the evaluations after the fire take the steady path for both,
    decide nothing more, and the store still stores the values once their refresh is due
    (``policy_seen``), so that a new engine on the file knows values at most ``REFRESH_S``
    old."""
    twin = RULES.split("      - policy: drain")[0].replace("policy: reclaim", "policy: reclaim-b")
    (tmp_path / "rules" / "p.yaml").write_text(RULES + twin.split("rules:\n", 1)[1])
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": f"GPU-{i}"} for i in range(3)]
    taken = _count_steady(monkeypatch)
    group = engine.rules.groups[0]
    runs = 0
    decided: list[Decision] = []

    def run(seconds: float) -> None:
        nonlocal runs
        make.clock.now += seconds
        decided.extend(engine.evaluate_group(group) or [])
        runs += 1

    run(0)
    run(60)  # both policies fire: 6 actions
    assert engine.wait_idle(10)
    assert len(make.ran) == 6
    fired_at = make.clock.now
    del taken[:]
    while make.clock.now < fired_at + REFRESH_S + 30:
        run(30)
    assert engine.wait_idle(10)
    assert len(make.ran) == 6  # nothing decided again
    assert make.prom.queries.count("util < 0.2") == runs  # one answer for both policies
    steady = [name for name, hit in taken if hit]
    # every evaluation after the fire: the state its decisions settled is quiet again, so
    # the first one after it takes the steady path too (not the general one for every target)
    assert sorted(set(steady)) == ["reclaim", "reclaim-b"]
    assert len(steady) == len(taken)
    now = make.clock.now
    for name in ("reclaim", "reclaim-b"):
        targets = engine.store.policy_state(name).targets
        assert sorted(targets) == [f"uuid=GPU-{i}" for i in range(3)]
        assert {t.last_seen for t in targets.values()} == {now}  # this process: the last evaluation
        assert {t.status for t in targets.values()} == {evaluation.Status.FIRING}
    engine.stop()
    stored = make().store.policy_state("reclaim").targets  # read from the file
    assert {t.status for t in stored.values()} == {evaluation.Status.FIRING}
    for t in stored.values():
        assert now - REFRESH_S <= t.last_seen and t.last_seen > fired_at, t


@pytest.mark.parametrize("make", ["vector"], indirect=True)
def test_steady_evaluations_reuse_the_narrowed_clear_query_until_the_targets_change(
    make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrowed ``clear_expr`` is made again only when the targets change
    (``gpuops.runtime.cycle.clears.ClearQueries``, keyed on the state's base); a steady
    evaluation asks the one it has; once a target clears, the query names only the one
    left."""
    rules = RULES.replace("        cooldown: 1h\n", "        clear_expr: util > 0.5\n", 1)
    (tmp_path / "rules" / "p.yaml").write_text(rules.replace("for: 60s", "for: 0s"))
    engine = make()
    made: list[int] = []
    narrowed = cycle_module.narrowed

    def counted(expr, names, firing):  # type: ignore[no-untyped-def]
        made.append(len(firing))
        return narrowed(expr, names, firing)

    monkeypatch.setattr(cycle_module, "narrowed", counted)
    taken = _count_steady(monkeypatch)
    make.prom.results["util < 0.2"] = [{"uuid": "GPU-1"}, {"uuid": "GPU-2"}]
    assert len(cycle(engine)) == 2  # both fire
    for _ in range(5):
        assert cycle(engine, 10) == []
    both = '(util{uuid=~"GPU-1|GPU-2"}) > (0.5)'
    assert make.prom.queries.count(both) == 5
    assert [hit for _, hit in taken[-5:]] == [True] * 5  # steady, the narrowed query reused
    assert made == [2]  # once, for the fire's settled state (kept by the steady evaluations)
    make.prom.results["util < 0.2"] = [{"uuid": "GPU-1"}]
    make.prom.results[both] = [{"uuid": "GPU-2"}]
    (cleared,) = cycle(engine, 10)
    assert cleared.transition == "clear" and cleared.target.key == "uuid=GPU-2"
    asked = len(make.prom.queries)
    assert cycle(engine, 10) == []
    clears = [q for q in make.prom.queries[asked:] if "> (0.5)" in q]
    assert clears == ['(util{uuid=~"GPU-1"}) > (0.5)'] or clears == ['(util{uuid="GPU-1"}) > (0.5)']


@pytest.mark.parametrize("make", ["vector"], indirect=True)
def test_a_reload_forgets_the_clear_query_of_a_policy_that_is_gone(make, tmp_path: Path) -> None:
    """The narrowed ``clear_expr`` of a removed or renamed policy, and the targets it was
    made for, go at the reload that drops it (not kept for the life of the process)."""
    rules = RULES.replace("        cooldown: 1h\n", "        clear_expr: util > 0.5\n", 1)
    rule_file = tmp_path / "rules" / "p.yaml"
    rule_file.write_text(rules.replace("for: 60s", "for: 0s"))
    engine = make()
    make.prom.results["util < 0.2"] = [{"uuid": "GPU-1"}]
    assert len(cycle(engine)) == 1
    assert cycle(engine, 10) == []
    assert "reclaim" in engine.cycle._clear_queries  # made for the firing target
    rule_file.write_text(
        rules.replace("for: 60s", "for: 0s").replace("policy: reclaim", "policy: r2")
    )
    assert engine.reload().ok
    assert "reclaim" not in engine.cycle._clear_queries
    assert engine.rules.policy("r2") is not None
