"""The push path on a real Slurm: a GPU fault drains its node with a reason gpuops owns; a node
with the veto feature is held at the gate (``suppressed:veto``) and left as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.sim.slurmcluster import SlurmCluster
from tests.integration.api.harness import running_api
from tests.integration.api.test_health_events import HEALTH_RULES, POLICY, event, push
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def flags(slurm: SlurmCluster, name: str) -> tuple[set[str], str]:
    nodes = json.loads(slurm.cmd("sinfo", "--json"))["nodes"]
    found = next(n for n in nodes if n["name"] == name)
    return set(found["state_flags"]), str(found.get("reason") or "")


def test_a_fault_drains_its_node_and_a_vetoed_node_is_held(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    slurm.cmd(
        "scontrol",
        "update",
        "nodename=gpu-a",
        "availablefeatures=gpuops_do_not_touch",
        "activefeatures=gpuops_do_not_touch",
    )
    rules = HEALTH_RULES.replace(
        "target: [node]\n        action: {type: migrate, executor: log}",
        "target: [node]\n        action: {type: migrate, executor: slurm}",
    )
    settings = {
        "slurm": {
            "slurm_conf": str(slurm.conf),
            "timeout_s": 5,
            "veto_feature": "gpuops_do_not_touch",
        }
    }
    with running_api(tmp_path, rules=rules, executors=settings) as api:
        answer = push(
            api, event(api, "a-1", "gpu-a", "GPU-a", 79), event(api, "b-1", "gpu-b", "GPU-b", 79)
        )
        assert answer.json()["faults"] == 2
        api.settle()
        wait_for(lambda: "DRAIN" in flags(slurm, "gpu-b")[0], 20, "gpu-b drained")
        state, reason = flags(slurm, "gpu-b")
        assert reason.startswith(f"gpuops:{POLICY}:")
        assert "DRAIN" not in flags(slurm, "gpu-a")[0]
        with api.lock:
            verdicts = {
                d.target.labels["node"]: d.verdict.value
                for d, _ in api.decisions
                if d.policy == POLICY
            }
        assert verdicts == {"gpu-a": "suppressed:veto", "gpu-b": "execute"}
