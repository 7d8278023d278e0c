"""A batch operation on a real local Slurm: each node drained (with gpuops' reason) for its
step, validated, resumed; a node an admin drained before stays drained with the admin's reason;
the fleet read from Slurm (``--slurm``) counts it against ``max_unavailable``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.actions.command import CommandExecutor
from gpuops.actions.slurm import SlurmExecutor
from gpuops.model.batch.opfile import load_operation
from gpuops.runtime.batch import BatchStatus, NodeStatus
from gpuops.runtime.fleets import SlurmFleet
from gpuops.sim.slurmcluster import NodeSpec, SlurmCluster
from tests.builders import build_engine

pytestmark = pytest.mark.integration


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    """Three GPU nodes (the shared fixture has two and a CLOUD one)."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gpuops-slurm-", dir="/tmp"))
    nodes = (NodeSpec("gpu-a"), NodeSpec("gpu-b", first_minor=2), NodeSpec("gpu-c", first_minor=4))
    cluster = SlurmCluster(root, nodes=nodes).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_drain_step_validate_resume_on_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm.cmd("scontrol", "update", "nodename=gpu-c", "state=drain", "reason=admin: fan swap")
    seen = tmp_path / "seen"
    seen.mkdir()
    op_file = tmp_path / "op.yaml"
    op_file.write_text(
        "operation: reboot-gpus\n"
        "targets: {nodes: [gpu-a, gpu-b, gpu-c]}\n"
        "quarantine: slurm\n"
        "step:\n"
        f'  command: [sh, -c, \'sinfo -h -n "$1" -o %T > {seen}/"$1"\', step,'
        " '{{ $labels.node }}']\n"
        "validate: {command: [sinfo, -h, -n, '{{ $labels.node }}']}\n"
        "canary: 1\nmax_parallel: 2\nmax_unavailable: 2\nfailure_threshold: 1\nenforce: true\n"
    )
    fleet = SlurmFleet(str(slurm.conf))
    engine = build_engine(
        tmp_path,
        {},
        reload=False,
        executors={"slurm": SlurmExecutor, "command": CommandExecutor},
        executor_settings={
            "slurm": {"slurm_conf": str(slurm.conf), "timeout_s": 5},
            "command": {"env": {"SLURM_CONF": str(slurm.conf)}},
        },
    )
    try:
        batch = engine.batches.start(load_operation(op_file), op_file.read_text(), fleet, None)
        rec = engine.batches.run(batch, fleet)
        nodes = engine.batches.nodes(batch)
    finally:
        engine.stop()
    assert rec.status == BatchStatus.DONE and rec.why == ""
    assert {n: r.status for n, r in nodes.items()} == {
        "gpu-a": NodeStatus.DONE,
        "gpu-b": NodeStatus.DONE,
        "gpu-c": NodeStatus.DONE,
    }
    # each stepped while drained; one up node at a time (gpu-c, out already, takes no room)
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        assert (seen / name).read_text().strip() == "drained"
    assert (nodes["gpu-a"].wave, nodes["gpu-b"].wave, nodes["gpu-c"].wave) == (0, 1, 1)
    assert [u for _, _, u in rec.timeline] == [2, 2]
    state = {n["name"]: n for n in json.loads(slurm.cmd("sinfo", "--json"))["nodes"]}
    assert "DRAIN" not in state["gpu-a"]["state_flags"]
    assert "DRAIN" not in state["gpu-b"]["state_flags"]
    assert "DRAIN" in state["gpu-c"]["state_flags"]  # drained before: stays so
    assert state["gpu-c"]["reason"] == "admin: fan swap"
