"""The fleet executor (``gpuops.actions.fleet``) against the simulated fleet's control API on a
loopback port: each verb changes the fleet, a repeated decision id is replayed, a refusal is
the executor's permanent error; a reclaim on a virtual fleet counts in its report."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuops.actions.base import PermanentError
from gpuops.actions.fleet import FleetExecutor
from gpuops.sim.fleet import FleetConfig, FleetSim
from gpuops.sim.fleet.report import Recorder
from gpuops.sim.fleet.virtual import VirtualFleet
from tests.integration.sim.conftest import quiet_sim
from tests.unit.actions.support import make_decision
from tests.unit.sim.fleet import test_consolidation as consolidation
from tests.unit.sim.fleet import test_scheduler as scheduler
from tests.unit.sim.fleet import test_sharing as sharing


@pytest.fixture
def consolidating(tmp_path: object) -> Iterator[FleetSim]:
    with quiet_sim(tmp_path, (consolidation.POOL,), consolidation.CLASSES) as running:
        yield running


def test_executor_consolidates_through_the_control_api(consolidating: FleetSim) -> None:
    sim = consolidating
    job = sim.cluster.submit(consolidation.training(1, "node-1"))
    sim.cluster.submit(consolidation.training(2, "node-0"))
    executor = FleetExecutor({"url": sim.control_url})
    decision = make_decision("consolidate", "fleet", {}, did="d-c", node="node-1", pool="a")
    changed = executor.run(decision)
    assert changed["node"] == "node-1" and job.node == "node-0"
    assert executor.run(decision) == changed  # same decision id: replayed, nothing moved
    again = make_decision("consolidate", "fleet", {}, did="d-c2", node="node-0", pool="a")
    with pytest.raises(PermanentError, match="409 node node-0 uses 3 of its 4 GPUs"):
        executor.run(again)


@pytest.fixture
def scheduling(tmp_path: object) -> Iterator[FleetSim]:
    config = FleetConfig(
        arrival_rate_per_min=0.0,
        sd_file=f"{tmp_path}/gpu-nodes.json",
        priority_classes=scheduler.CLASSES,
    )
    with FleetSim(config) as running:
        yield running


def test_executor_grants_and_releases_through_the_control_api(scheduling: FleetSim) -> None:
    sim = scheduling
    executor = FleetExecutor({"url": sim.control_url})
    labels = {"project": "team/a b", "pool": "default", "quota_request": "q-1"}
    grant = make_decision("grant_quota", "fleet", {"gpus": 4}, did="d-grant", **labels)
    changed = executor.run(grant)
    assert changed["grant"]["project"] == "team/a b"
    assert executor.run(grant) == changed  # same decision id: replayed, no second node
    assert len(sim.cluster.nodes) == 5
    undo = make_decision("release_quota", "fleet", {}, did="d-undo", **labels)
    assert executor.run(undo)["removed"] == changed["grant"]["nodes"]
    assert len(sim.cluster.nodes) == 4
    hold = make_decision("hold_class", "fleet", {"priority_class": "batch"}, did="d-hold")
    assert executor.run(hold) == {"priority_class": "batch", "held": True}


@pytest.fixture
def sharing_gpus(tmp_path: object) -> Iterator[FleetSim]:
    with quiet_sim(tmp_path, (sharing.SLICED,), sharing.CLASSES) as running:
        yield running


def test_executor_packs_and_lends_through_the_control_api(sharing_gpus: FleetSim) -> None:
    sim = sharing_gpus
    job = sim.cluster.submit(sharing.light())
    executor = FleetExecutor({"url": sim.control_url})
    pack = make_decision("pack", "fleet", {}, did="d-pack", node="node-0", uuid=job.gpu_uuids[0])
    changed = executor.run(pack)
    assert changed["job"] == job.id and job.shared
    assert executor.run(pack) == changed  # same decision id: replayed
    lend = make_decision("lend", "fleet", {}, did="d-lend", pool="v")
    assert executor.run(lend) == {"pool": "v", "lending": True}
    unlend = make_decision("unlend", "fleet", {}, did="d-unlend", pool="v")
    assert executor.run(unlend) == {"pool": "v", "lending": False}


def test_the_engines_fleet_executor_acts_on_a_virtual_fleet() -> None:
    recorder = Recorder()
    with VirtualFleet(
        FleetConfig(arrival_rate_per_min=0.0), 0, None, 30.0, recorder=recorder
    ) as fleet:
        executor = FleetExecutor({"url": fleet.serve_control()})
        fleet.run_until(1800.0)
        notebook = next(j for j in fleet.cluster.jobs.values() if j.profile == "notebook")
        uuid = notebook.gpu_uuids[0]
        executor.run(make_decision("reclaim", "fleet", node=str(notebook.node), uuid=uuid))
        assert notebook.id not in fleet.cluster.jobs  # applied at virtual 30 min, at once
        fleet.run_until(3600.0)
    report = recorder.report(fleet.cluster)
    assert report.reclaims == 1
    assert report.reclaimed_gpu_hours == 0.0  # the notebook had no end: nothing scheduled lost
    # the scrape at 30 min saw 15 GPUs allocated (it came before the reclaim) and holds
    # until the next one, as a Prometheus sample does
    assert report.allocation_ratio == pytest.approx((15 * 1830 + 14 * 1770) / (16 * 3600))
