"""The remediation ladder on a real Slurm: a faulty GPU's node is drained with a reason gpuops
owns, rebooted by ``scontrol reboot`` (the cluster's ``RebootProgram`` restarts its slurmd as
a fresh boot) and comes back still drained with gpuops' reason, is checked while drained, and
only then resumed; a node an admin drained is neither rebooted nor resumed; the executor's
``reboot`` refuses a node gpuops did not drain and reboots once per decision id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.actions.base import PermanentError
from gpuops.actions.slurm import SlurmExecutor
from gpuops.model.health.ladder import Stage
from gpuops.sim.slurmcluster import SlurmCluster
from tests.integration.api.harness import running_api
from tests.integration.api.test_health_events import event, push
from tests.integration.runtime.test_health_ladder import LADDER_RULES as RULES
from tests.integration.runtime.test_health_ladder import POLICY
from tests.unit.actions.support import make_decision
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

LADDER_RULES = RULES.replace("executor: log}", "executor: slurm}")
CHECK = 'test "$(sinfo -h -n "$1" -o %T)" = drained && grep -qx "$1" "$2"'
"""The health check: the node is still drained (not returned before it passed) and was
rebooted."""


def node(slurm: SlurmCluster, name: str) -> tuple[str, set[str], str]:
    found = next(n for n in json.loads(slurm.cmd("sinfo", "--json"))["nodes"] if n["name"] == name)
    return str(found["state"]), set(found["state_flags"]), str(found.get("reason") or "")


def test_a_node_is_rebooted_kept_drained_checked_and_resumed_and_an_admins_drain_is_left(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    slurm.cmd("scontrol", "update", "nodename=gpu-b", "state=drain", "reason=admin: loose fan")
    reboots = slurm.root / "log" / "reboots.log"
    health = {
        "default_profile": "full",
        "ladder": {
            "reboot": {"executor": "slurm", "params": {"timeout_s": 30}},
            "validation": {
                "command": ["sh", "-c", CHECK, "check", "{{ $labels.node }}", str(reboots)],
                "timeout": 20,
            },
            "interval": 3600,
        },
    }
    executors = {
        "slurm": {"slurm_conf": str(slurm.conf), "timeout_s": 5, "reboot_poll_s": 0.2},
        "command": {"env": {"SLURM_CONF": str(slurm.conf)}},
    }
    with running_api(tmp_path, rules=LADDER_RULES, executors=executors, health=health) as api:
        answer = push(
            api, event(api, "a-1", "gpu-a", "GPU-a", 79), event(api, "b-1", "gpu-b", "GPU-b", 79)
        )
        assert answer.json()["faults"] == 2

        def stage(name: str) -> Stage | None:
            repair = api.engine.ladder.repair(name)
            return None if repair is None else repair.stage

        wait_for(lambda: stage("gpu-a") in (Stage.RETURNED, Stage.NEEDS_HUMAN), 60, "gpu-a's climb")
        assert stage("gpu-a") is Stage.RETURNED, api.engine.ladder.repair("gpu-a")
        api.settle()
        assert slurm.reboots() == ["gpu-a"]
        state, flags, _ = node(slurm, "gpu-a")
        assert state == "idle" and "DRAIN" not in flags  # resumed after its check
        with api.lock:
            ran = [
                (d.target.labels["node"], d.policy, d.action.type, o.ok)
                for d, o in api.decisions
                if d.group == "health-ladder" and o is not None and d.action is not None
            ]
        assert ran == [
            ("gpu-a", POLICY, "reboot", True),
            ("gpu-a", POLICY, "validate", True),
            ("gpu-a", POLICY, "resume", True),
        ]
        # an admin's drain: the quarantine kept their reason, and the ladder left the node
        assert stage("gpu-b") is None
        state, flags, reason = node(slurm, "gpu-b")
        assert "DRAIN" in flags and reason == "admin: loose fan"


def test_reboot_refuses_a_node_gpuops_did_not_drain_and_reboots_once_per_decision(
    slurm: SlurmCluster,
) -> None:
    ex = SlurmExecutor({"slurm_conf": str(slurm.conf), "timeout_s": 5, "reboot_poll_s": 0.2})
    in_service = make_decision("reboot", "slurm", {"timeout_s": 20}, node="gpu-b")
    with pytest.raises(PermanentError, match="node gpu-b is not drained by gpuops"):
        ex.run(in_service)
    mine = f"gpuops:{in_service.policy}:0123"
    slurm.cmd("scontrol", "update", "nodename=gpu-a", "state=drain", f"reason={mine}")
    reboot = make_decision("reboot", "slurm", {"timeout_s": 20}, did="reboot-1", node="gpu-a")
    first = ex.run(reboot)
    assert (first.rebooted, first.already) == (True, None)
    again = ex.run(reboot)  # the same decision, run again (a restart mid-step): done already
    assert (again.rebooted, again.already) == (True, True)
    assert slurm.reboots() == ["gpu-a"]
    state, flags, reason = node(slurm, "gpu-a")
    assert "DRAIN" in flags and reason.startswith(f"gpuops:{in_service.policy}:reboot-1")
