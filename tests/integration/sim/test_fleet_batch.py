"""A batch operation run by the engine's batch runner against the simulated fleet, its nodes
drained and returned through the fleet executor's ``migrate`` and ``resume`` (``quarantine:
fleet``): each node's step runs while the fleet says it is drained, its jobs go back to the
queue or to other nodes, and every node is back in service after it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests

from gpuops.actions.command import CommandExecutor
from gpuops.actions.fleet import FleetExecutor
from gpuops.model.batch.operation import Availability, FleetNode
from gpuops.model.batch.opfile import load_operation
from gpuops.runtime.batch import BatchStatus
from gpuops.sim.fleet import FleetSim
from tests.builders import build_engine

pytestmark = pytest.mark.integration

STEP = """\
import json, sys, urllib.request
nodes = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/state"))["nodes"]
state = next(n["state"] for n in nodes if n["name"] == sys.argv[2])
open(sys.argv[3] + "/" + sys.argv[2], "w").write(state)
"""


class SimFleet:
    """The fleet as the simulated fleet's state API says it is now."""

    def __init__(self, url: str) -> None:
        self.url = url

    def nodes(self) -> list[FleetNode]:
        state = requests.get(f"{self.url}/api/v1/state", timeout=5).json()
        return [
            FleetNode(
                n["name"],
                pool=n["pool"],
                gpus=len(n["gpus"]),
                availability=Availability.UP if n["state"] == "up" else Availability.DRAINED,
            )
            for n in state["nodes"]
        ]


def test_a_batch_operation_drains_and_returns_simulated_nodes(
    fleet: FleetSim, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "step.py").write_text(STEP, encoding="utf-8")
    op_file = tmp_path / "op.yaml"
    op_file.write_text(
        "operation: restart\n"
        "targets: {nodes: [node-0, node-1, node-2]}\n"
        "quarantine: fleet\n"
        f"step: {{command: [{sys.executable}, {tmp_path}/step.py, {fleet.control_url},"
        f" '{{{{ $labels.node }}}}', {seen}]}}\n"
        "canary: 1\nmax_parallel: 2\nmax_unavailable: 2\nenforce: true\n",
        encoding="utf-8",
    )
    jobs = {n: len(fleet.cluster.nodes[n].job_ids()) for n in ("node-0", "node-1", "node-2")}
    sim = SimFleet(fleet.control_url)
    engine = build_engine(
        tmp_path,
        {},
        reload=False,
        executors={"fleet": FleetExecutor, "command": CommandExecutor},
        executor_settings={"fleet": {"url": fleet.control_url}},
    )
    try:
        batch = engine.batches.start(load_operation(op_file), op_file.read_text(), sim, None)
        rec = engine.batches.run(batch, sim)
        nodes = engine.batches.nodes(batch)
        steps = engine.store.decisions(f"batch/{batch}", None, 100)
    finally:
        engine.stop()
    assert rec.status == BatchStatus.DONE, rec.why
    assert {n: r.done for n, r in nodes.items()} == {
        n: ["quarantine", "step", "return"] for n in ("node-0", "node-1", "node-2")
    }
    for name in ("node-0", "node-1", "node-2"):
        assert (seen / name).read_text() == "drained"  # the step ran on a drained node
    assert [n.availability for n in sim.nodes()] == [Availability.UP] * 4
    assert (
        sorted(
            (s.decision.action.type, s.outcome.status.value)
            for s in steps
            if s.decision.action and s.decision.action.executor == "fleet" and s.outcome
        )
        == [("migrate", "success")] * 3 + [("resume", "success")] * 3
    )
    counters = fleet.cluster.counters
    assert counters["migrated"] + counters["requeued_by_migrate"] == sum(jobs.values()) > 0
