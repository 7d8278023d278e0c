"""A batch operation rolled over the simulated cluster (``gpuops.sim.fleet.rollout``): waves
as the runner takes them (canary, then ``max_parallel``, never more than the budget out of
service, counting nodes out for any reason), each node drained, booting during its reboot,
back in service with its new driver after its procedure; what it cost."""

from __future__ import annotations

from dataclasses import replace

from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.rollout import RolloutSpec
from gpuops.sim.fleet.virtual import VirtualFleet

NODES = ("node-0", "node-1", "node-2", "node-3")
SPEC = RolloutSpec(
    name="driver-560",
    targets=NODES,
    at_s=600.0,
    canary=1,
    max_parallel=2,
    budget=2,
    quarantine_s=60.0,
    step_s=600.0,
    reboot_s=300.0,
    validate_s=60.0,
    return_s=10.0,
    driver_version="560.35.03",
)


def drivers(fleet: VirtualFleet) -> dict[str, str]:
    """The driver version each node's GPUs report (``nvml_gpu_info``) at the last scrape."""
    found: dict[str, str] = {}
    for labels in fleet.last:
        series = dict(labels)
        if series["__name__"] == "nvml_gpu_info":
            found[series["node"]] = series["driver_version"]
    return found


def test_the_rollout_takes_nodes_out_wave_after_wave_within_the_budget() -> None:
    fleet = VirtualFleet(FleetConfig(), 0, scrape_interval_s=15.0)
    jobs_on_first = len(fleet.cluster.nodes["node-0"].job_ids())
    assert jobs_on_first > 0
    fleet = VirtualFleet(FleetConfig(), 0, scrape_interval_s=15.0, rollout=SPEC)
    states: dict[float, dict[str, str]] = {}
    for t in range(0, 5400, 15):
        fleet.run_until(float(t))
        states[float(t)] = {n.name: n.state for n in fleet.cluster.nodes.values()}
        assert sum(s != "up" for s in states[float(t)].values()) <= SPEC.budget
        if t == 600 + 60 + 600 + 60:  # node-0 rebooting: its old driver still reported
            assert states[float(t)]["node-0"] == "booting"
            assert drivers(fleet)["node-1"] == "550.54.15"
    report = fleet.rollout.report if fleet.rollout else None
    assert report is not None
    assert [nodes for _, nodes in report.waves] == [
        ("node-0",),
        ("node-1", "node-2"),
        ("node-3",),
    ]
    assert report.waves[0][0] == 600.0
    assert states[585.0]["node-0"] == "up" and states[600.0]["node-0"] == "drained"
    assert report.done == list(NODES) and report.skipped == {}
    assert report.ended_s == 600.0 + 3 * 1035.0  # each wave ends at the step after 1,030 s
    assert report.gpu_s_out == 4 * 4 * 1035.0
    assert report.requeued + report.moved >= jobs_on_first
    assert report.most_out == 2 and report.upgraded == 4
    assert set(drivers(fleet).values()) == {"560.35.03"}
    assert all(n.state == "up" for n in fleet.cluster.nodes.values())
    lines = report.lines()
    assert lines[0] == (
        "rollout driver-560 from +10m: 4 nodes, 4 done in 3 waves, ended at +1h1m45s (51m45s)"
    )
    assert lines[1] == (
        "  GPU-hours out of service: 4.6 (33.3% of the fleet's GPU-hours while it ran)"
    )
    assert report.to_json()["duration_s"] == 3105.0


def test_a_node_out_before_stays_out_and_takes_no_room_a_failed_one_is_skipped() -> None:
    spec = replace(SPEC, budget=3)
    fleet = VirtualFleet(FleetConfig(), 0, scrape_interval_s=15.0, rollout=spec)
    ops.migrate(fleet.cluster, "node-1")  # an admin drained it: it stays so after
    ops.fail(fleet.cluster, "node-3")
    fleet.run_until(5400.0)
    report = fleet.rollout.report if fleet.rollout else None
    assert report is not None
    assert report.skipped == {"node-3": "failed"}
    assert [nodes for _, nodes in report.waves] == [("node-0",), ("node-1", "node-2")]
    assert report.done == ["node-0", "node-1", "node-2"] and report.waited_s == 0.0
    assert fleet.cluster.nodes["node-1"].state == "drained"
    assert fleet.cluster.nodes["node-1"].driver_version == "560.35.03"
    assert report.gpu_s_out == 2 * 4 * 1035.0  # node-1's time out is not the rollout's
    assert report.lines()[-1] == "  skipped node-3: failed"


def test_no_room_under_the_budget_holds_the_rollout_and_the_report_says_so() -> None:
    fleet = VirtualFleet(FleetConfig(), 0, scrape_interval_s=15.0, rollout=SPEC)
    ops.migrate(fleet.cluster, "node-1")
    ops.fail(fleet.cluster, "node-3")  # two out: the budget of 2 leaves no room for node-0
    fleet.run_until(5400.0)
    report = fleet.rollout.report if fleet.rollout else None
    assert report is not None
    assert [nodes for _, nodes in report.waves] == [("node-1",)]
    assert report.ended_s is None and report.waited_s > 3600.0
    assert fleet.cluster.nodes["node-0"].state == "up"
    assert "not finished when the run ended (2 left)" in report.lines()[0]


def test_without_a_canary_the_first_wave_is_a_whole_one() -> None:
    fleet = VirtualFleet(
        FleetConfig(), 0, scrape_interval_s=15.0, rollout=replace(SPEC, canary=0, at_s=0.0)
    )
    fleet.run_until(3600.0)
    report = fleet.rollout.report if fleet.rollout else None
    assert report is not None
    assert [nodes for _, nodes in report.waves] == [("node-0", "node-1"), ("node-2", "node-3")]
    assert report.waves[0][0] == 0.0 and report.ended_s == 2 * 1035.0
