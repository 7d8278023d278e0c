"""The remediation ladder on a real engine and API: faults pushed by the node agents' path
quarantine their nodes (profile ``full``), and the ladder's steps run as programs through the
command executor against a fleet of nodes with scripted GPU faults (``tests.fakes.gpufaults``):
a fault a reset heals, one only a reboot heals, one nothing heals (needs a human, told by
webhook, never remediated again), a replayed event after the return, a restart mid-ladder;
50 faults in one pool paced 1, 2, 4, ... while another pool's is repaired at once; and the
node agent (over the fake NVML) resetting a GPU and checking it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuops.exporters.nvml import scenarios
from gpuops.exporters.nvml.scenarios import fake_reset
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.model.decisions import Verdict
from gpuops.model.health.catalogue import Remedy
from gpuops.model.health.ladder import Quarantine, Stage
from gpuops.settings import GuardrailSettings
from tests.fakes.receiver import Receiver
from tests.integration.api.harness import RULES, Harness, running_api
from tests.integration.api.test_health_events import event, push
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

POLICY = "quarantine-and-repair-faulty-gpu-node"
LADDER_RULES = (
    RULES
    + f"""\
      - policy: {POLICY}
        trigger: {{alertmanager: {{alertname: GpuFault, profile: full}}}}
        action: {{type: migrate, executor: log}}
        mode: enforce
"""
)
FLEET = str(Path(__file__).parents[2] / "fakes" / "gpufaults.py")


def health(tmp: Path, webhook: str | None = None, kill: Path | None = None) -> dict[str, Any]:
    state = str(tmp / "fleet.json")

    def step(verb: str, *extra: str) -> dict[str, Any]:
        argv = [sys.executable, FLEET, state, verb, "{{ $labels.node }}", *extra]
        return {"executor": "command", "params": {"argv": argv, "timeout_s": 30}}

    ladder: dict[str, Any] = {
        "reset_gpu": step("reset_gpu", *(("--kill", str(kill)) if kill else ())),
        "reboot": step("reboot"),
        "validation": {"command": step("validate")["params"]["argv"], "timeout": 30},
        "interval": 3600,
    }
    if webhook:
        ladder["webhook"] = {"executor": "webhook", "params": {"url": webhook}}
    return {"default_profile": "full", "ladder": ladder}


def faults(tmp: Path, **nodes: str) -> None:
    (tmp / "fleet.json").write_text(
        json.dumps({n: {"fault": f, "done": []} for n, f in nodes.items()})
    )


def done(tmp: Path, node: str) -> list[str]:
    return list(json.loads((tmp / "fleet.json").read_text())[node]["done"])


def stage(api: Harness, node: str) -> Stage | None:
    repair = api.engine.ladder.repair(node)
    return None if repair is None else repair.stage


def settled(api: Harness, node: str, *stages: Stage) -> None:
    wait_for(lambda: stage(api, node) in stages, 60, f"{node} {stages}")
    api.settle()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def api(tmp_path: Path, receiver: Receiver) -> Iterator[Harness]:
    health_settings = health(tmp_path, webhook=receiver.url)
    with running_api(tmp_path, rules=LADDER_RULES, health=health_settings) as h:
        yield h


def test_a_fault_a_reset_heals_is_reset_checked_and_returned_once(
    api: Harness, tmp_path: Path
) -> None:
    faults(tmp_path, n1="reset")
    fault = event(api, "n1-1", "n1", "GPU-a", 48)
    assert push(api, fault).json()["faults"] == 1
    settled(api, "n1", Stage.RETURNED)
    assert done(tmp_path, "n1") == ["reset_gpu", "validate"]
    with api.lock:
        moves = [
            (d.action.type, o.ok)
            for d, o in api.decisions
            if d.group == "health-ladder" and o and d.action
        ]
    assert moves == [("reset_gpu", True), ("validate", True), ("resume", True)]
    # the same event sent again, and replayed under another id: nothing more happens
    assert push(api, fault).json()["duplicates"] == 1
    replayed = {**fault, "id": "n1-1-replayed"}
    assert push(api, replayed).json() == {"accepted": 1, "duplicates": 0, "faults": 0, "skipped": 1}
    api.settle()
    assert done(tmp_path, "n1") == ["reset_gpu", "validate"]
    assert stage(api, "n1") is Stage.RETURNED
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_ladder_nodes{stage="returned"} 1.0' in metrics
    assert "gpuops_health_time_to_return_seconds_count 1.0" in metrics
    assert 'gpuops_health_ladder_attempts_sum{end="returned"} 1.0' in metrics
    assert "gpuops_health_time_between_incidents_seconds_count 0.0" in metrics


def test_a_fault_only_a_reboot_heals_is_reset_then_rebooted(api: Harness, tmp_path: Path) -> None:
    faults(tmp_path, n2="reboot")
    assert push(api, event(api, "n2-1", "n2", "GPU-b", 48)).json()["faults"] == 1
    settled(api, "n2", Stage.RETURNED)
    assert done(tmp_path, "n2") == ["reset_gpu", "validate", "reboot", "validate"]


def test_a_fault_that_calls_for_a_reboot_is_never_reset(api: Harness, tmp_path: Path) -> None:
    faults(tmp_path, n3="reset")
    assert push(api, event(api, "n3-1", "n3", "GPU-c", 79)).json()["faults"] == 1
    settled(api, "n3", Stage.RETURNED)
    assert done(tmp_path, "n3") == ["reboot", "validate"]


def test_a_fault_nothing_heals_needs_a_human_and_is_never_remediated_again(
    api: Harness, tmp_path: Path, receiver: Receiver
) -> None:
    faults(tmp_path, n4="never")
    assert push(api, event(api, "n4-1", "n4", "GPU-d", 48)).json()["faults"] == 1
    settled(api, "n4", Stage.NEEDS_HUMAN)
    wait_for(lambda: api.engine.ladder.repair("n4").told, 30, "the hand-over")  # type: ignore[union-attr]
    assert done(tmp_path, "n4") == ["reset_gpu", "validate", "reboot", "validate"]
    [told] = receiver.received
    body = json.loads(told.body)
    assert body["action"]["type"] == "needs_human"
    assert body["target"]["labels"] == {"node": "n4", "uuid": "GPU-d"}
    assert body["reason"].startswith(
        "node n4 needs a human: the health check failed after reset_gpu, reboot"
    )
    # another fault of the node (a new episode): quarantined again, never remediated
    assert push(api, event(api, "n4-2", "n4", "GPU-d", 95)).json()["faults"] == 1
    api.settle()
    api.engine.ladder.tick()
    api.settle()
    assert done(tmp_path, "n4") == ["reset_gpu", "validate", "reboot", "validate"]
    assert len(receiver.received) == 1
    # an admin clears it: its next fault climbs again
    answer = api.call("admin", "POST", "/api/v1/health/nodes/n4/clear")
    assert answer.status_code == 200, answer.text
    assert answer.json()["stage"] == "healthy"
    faults(tmp_path, n4="reset")
    api.clock.advance(5)  # its next incident, 5 s after the first
    assert push(api, event(api, "n4-3", "n4", "GPU-d", 64)).json()["faults"] == 1
    api.settle()  # its pool cools down after the failed repair (1 min, jittered)
    waiting = api.engine.ladder.repair("n4")
    assert waiting is not None and waiting.stage is Stage.QUARANTINED
    assert waiting.why.startswith("deferred: paced repair in pool=default: cooling down")
    api.clock.advance(120)
    api.engine.ladder.tick()
    settled(api, "n4", Stage.RETURNED)
    assert done(tmp_path, "n4") == ["reset_gpu", "validate"]
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_ladder_attempts_sum{end="needs_human"} 2.0' in metrics
    assert 'gpuops_health_ladder_attempts_sum{end="returned"} 1.0' in metrics
    assert "gpuops_health_time_between_incidents_seconds_count 1.0" in metrics
    assert "gpuops_health_time_between_incidents_seconds_sum 5.0" in metrics
    assert "gpuops_health_time_to_return_seconds_count 1.0" in metrics


def test_a_restart_mid_ladder_goes_on_without_redoing_a_step(tmp_path: Path) -> None:
    kill = tmp_path / "kill"
    guardrails = GuardrailSettings(kill_switch_file=kill)
    faults(tmp_path, n5="reset")
    settings = health(tmp_path, kill=kill)
    with running_api(tmp_path, rules=LADDER_RULES, health=settings, guardrails=guardrails) as first:
        assert push(first, event(first, "n5-1", "n5", "GPU-e", 48)).json()["faults"] == 1
        wait_for(kill.exists, 60, "the reset (it turns the kill switch on)")
        first.settle()
        repair = first.engine.ladder.repair("n5")
        assert repair is not None
        assert (repair.stage, repair.done, repair.passed) == (
            Stage.VALIDATING,
            ("reset_gpu",),
            False,
        )
    kill.unlink()
    with running_api(
        tmp_path, rules=LADDER_RULES, health=settings, guardrails=guardrails
    ) as second:
        second.engine.ladder.tick()
        settled(second, "n5", Stage.RETURNED)
    assert done(tmp_path, "n5") == ["reset_gpu", "validate"]


def test_fifty_faults_in_one_pool_are_repaired_in_widths_1_2_4_and_another_pool_at_once(
    tmp_path: Path,
) -> None:
    logged = {"executor": "log"}
    settings = {
        "default_profile": "full",
        "ladder": {
            "reset_gpu": logged,
            "reboot": logged,
            "validation": {"command": ["true"], "executor": "log"},
            "interval": 3600,
        },
    }
    with running_api(tmp_path, rules=LADDER_RULES, health=settings) as api:
        flood = [{**event(api, f"a{n}", f"a{n:02d}", "GPU-0", 48), "pool": "a"} for n in range(50)]
        other = {**event(api, "b1", "b01", "GPU-0", 48), "pool": "b"}
        assert push(api, *flood, other).json()["faults"] == 51
        api.settle()

        def returned() -> set[str]:
            return {r.node for r in api.engine.ladder.repairs() if r.stage is Stage.RETURNED}

        seen = returned()
        assert "b01" in seen  # the quiet pool's fault is repaired at once
        waiting = api.engine.ladder.repair("a49")
        assert waiting is not None and waiting.stage is Stage.QUARANTINED
        assert waiting.why == (
            "deferred: paced repair in pool=a: 1 unproven repair(s) at width 1 (it grows as repairs"
            " stay healthy 5m)"
        )
        with api.lock:
            paced = [d for d, _ in api.decisions if d.verdict.value == "suppressed:paced"]
        assert len(paced) == 49  # each waiting node's deferral audited once, naming its pool
        assert {d.reason.split(":")[0] for d in paced} == {"paced repair in pool=a"}
        widths = [len(seen - {"b01"})]
        while len(seen) < 51:
            api.clock.advance(300)  # the dwell: every repair returned so far held
            api.engine.ladder.tick()
            api.settle()
            now = returned()
            widths.append(len(now - seen))
            seen = now
        assert widths == [1, 2, 4, 8, 16, 19]
        metrics = api.call(None, "GET", "/metrics").text
        assert 'gpuops_health_ladder_deferrals_total{domain="pool=a"} 49.0' in metrics
        assert 'gpuops_health_ladder_width{domain="pool=b"} 2.0' in metrics  # its repair held
        assert 'gpuops_health_ladder_width{domain="pool=a"} 32.0' in metrics


def test_the_node_agent_resets_the_gpu_and_checks_it_by_nvml(tmp_path: Path) -> None:
    fake = scenarios.healthy_h100(1)
    fake.gpus[0].remapped_rows = (0, 1, 1, 0)  # a row remapping a reset applies
    agent = ExporterServer(
        fake, host="127.0.0.1", port=0, agent_token="t", xid_events=False, reset=fake_reset(fake)
    )
    agent.start()
    settings = {"default_profile": "full", "ladder": {"validation": {"executor": "nvml-agent"}}}
    executors = {"nvml-agent": {"url": f"http://127.0.0.1:{agent.port}", "token": "t"}}
    try:
        with running_api(tmp_path, rules=LADDER_RULES, health=settings, executors=executors) as api:
            uuid = fake.gpus[0].uuid
            assert push(api, event(api, "n6-1", "n6", uuid, 48)).json()["faults"] == 1
            settled(api, "n6", Stage.RETURNED)
            assert api.engine.ladder.repair("n6").done == ("reset_gpu",)  # type: ignore[union-attr]
    finally:
        agent.close()
    assert fake.gpus[0].resets == 1
    assert fake.gpus[0].remapped_rows == (0, 1, 0, 0)


def test_a_move_held_by_dry_run_is_tried_every_tick_and_audited_once(tmp_path: Path) -> None:
    faults(tmp_path, n7="reset")
    guardrails = GuardrailSettings(dry_run=True)
    settings = health(tmp_path)
    with running_api(tmp_path, rules=LADDER_RULES, health=settings, guardrails=guardrails) as api:
        ladder = api.engine.ladder
        q = Quarantine(
            node="n7",
            gpu="GPU-g",
            remedy=Remedy.RESET_GPU,
            reason="XID 48",
            policy=POLICY,
            executor="log",
            decision_id="d-n7",
            episode=api.clock(),
        )
        assert ladder.quarantined(q)
        for _ in range(5):
            ladder.tick()
            assert ladder.wait_idle(30)
        metrics = api.call(None, "GET", "/metrics").text  # tried again at every tick
        assert 'gpuops_health_ladder_moves_total{move="reset_gpu",result="held"} 5.0' in metrics
        with api.lock:
            audited = [d for d, _ in api.decisions if d.group == "health-ladder"]
        assert [(d.verdict, d.reason) for d in audited] == [
            (
                Verdict.DRY_RUN,
                "remediation ladder: reset_gpu of n7 (XID 48): engine is in dry-run",
            )
        ]
        repair = ladder.repair("n7")
        assert repair is not None and repair.stage is Stage.REMEDIATING
    assert done(tmp_path, "n7") == []
