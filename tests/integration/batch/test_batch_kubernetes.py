"""A batch operation on Kubernetes (the fake API server, ``tests.fakes.kube_apiserver``): each
node cordoned and drained by the ``kubernetes`` executor for its step, then uncordoned; a node
cordoned before the operation stays cordoned after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.actions.command import CommandExecutor
from gpuops.model.batch.operation import Availability, FleetNode
from gpuops.model.batch.opfile import parse_operation
from gpuops.runtime.batch import BatchStatus, NodeStatus
from tests.builders import build_engine
from tests.fakes.kube_apiserver import FakeApiServer
from tests.integration.actions.kube import executor, node, pod

pytestmark = pytest.mark.integration

OPERATION = """\
operation: kernel
targets: {nodes: [k1, k2, k3]}
quarantine: kubernetes
step: {command: ['true']}
canary: 1
max_parallel: 2
max_unavailable: 2
failure_threshold: 1
enforce: true
"""


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    for name in ("k1", "k2", "k3", "k4"):
        server.put("", "nodes", node(name))
    server.edit("", "nodes", "k3", spec={"unschedulable": True})  # an admin's cordon
    server.put("", "pods", pod("train-a", "k1", labels={"app": "train"}))
    yield server
    server.close()


class KubeFleet:
    """The nodes as the API server says they are: a cordoned one is out of service."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api

    def nodes(self) -> list[FleetNode]:
        return [
            FleetNode(
                name,
                pool="gpu",
                gpus=8,
                availability=Availability.DRAINED
                if self.api.get("", "nodes", name)["spec"].get("unschedulable")
                else Availability.UP,
            )
            for name in ("k1", "k2", "k3", "k4")
        ]


def test_cordon_drain_step_uncordon_on_kubernetes(api: FakeApiServer, tmp_path: Path) -> None:
    fleet = KubeFleet(api)
    engine = build_engine(
        tmp_path,
        {},
        reload=False,
        executors={"kubernetes": executor(api, tmp_path), "command": CommandExecutor},
    )
    try:
        batch = engine.batches.start(parse_operation(OPERATION, "op.yaml"), OPERATION, fleet, None)
        rec = engine.batches.run(batch, fleet)
        nodes = engine.batches.nodes(batch)
    finally:
        engine.stop()
    assert rec.status == BatchStatus.DONE and rec.why == "", {n: r.error for n, r in nodes.items()}
    assert {r.status for r in nodes.values()} == {NodeStatus.DONE}
    assert not api.get("", "nodes", "k1")["spec"].get("unschedulable")
    assert not api.get("", "nodes", "k2")["spec"].get("unschedulable")
    assert api.get("", "nodes", "k3")["spec"]["unschedulable"] is True  # cordoned before
    # drained off k1 for its step: evicted (the fake marks it deleted)
    assert api.get("", "pods", "train-a", "ml")["metadata"]["deletionTimestamp"]
    assert nodes["k3"].done == ["quarantine", "step"]  # never returned by the operation
