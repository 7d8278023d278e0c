"""Faults injected into a running simulated cluster: the crash at the fault, the black hole a
faulty GPU left in service is, the person on call, floods that make no GPU faulty, the fleet's
remediation steps, and the figures the reliability what-if reports."""

from __future__ import annotations

import pytest

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
)
from gpuops.model.health.catalogue_file import shipped_catalogue
from gpuops.runtime.health import FAULT_TRIGGER
from gpuops.sim.faults import FaultRates, Fix, InjectedFault
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.errors import Conflict
from gpuops.sim.fleet.health import REBOOT_S, RESET_S, VALIDATE_S
from gpuops.sim.fleet.report import p95
from gpuops.sim.reliability import FaultPlan, Injector
from gpuops.sim.whatif.runs import _Tally

STEP_S = 15.0
PLAN = FaultPlan(FaultRates(scale=1.0), response_s=3600.0, fix_s=1800.0, replace_s=7200.0)


def _busy_cluster() -> Cluster:
    """The default fleet (4 nodes of 4 GPUs, jobs arriving) ten minutes in: every GPU busy."""
    cluster = Cluster(FleetConfig(seed=3))
    for _ in range(40):
        cluster.advance(STEP_S)
    return cluster


def _run(cluster: Cluster, injector: Injector, until: float) -> None:
    while cluster.time < until:
        cluster.advance(STEP_S)
        injector.step(cluster)


def _busy_gpu(cluster: Cluster) -> tuple[str, str]:
    return next(
        (n.name, g.uuid) for n in cluster.nodes.values() for g in n.gpus if g.job is not None
    )


def _injector(
    cluster: Cluster, faults: list[InjectedFault], floods: list[float], manual: bool
) -> Injector:
    return Injector(PLAN, cluster, 86400.0, shipped_catalogue(), 0, manual, drawn=(faults, floods))


def test_without_gpuops_a_fault_crashes_jobs_until_a_person_drains_and_repairs_the_node() -> None:
    cluster = _busy_cluster()
    node, gpu = _busy_gpu(cluster)
    at = cluster.time + 30.0
    fault = InjectedFault(at, node, gpu, "faulty_gpu", 79, Fix.REBOOT)
    injector = _injector(cluster, [fault], [], manual=True)
    _run(cluster, injector, at + STEP_S)
    assert injector.state.faulty(node)
    assert injector.job_crashes >= 1 and injector.crash_gpu_s > 0
    assert injector.outbox == []  # no agent pushes without gpuops
    assert cluster.nodes[node].schedulable  # nobody knows yet: the node stays in service
    crashed = injector.job_crashes
    _run(cluster, injector, at + PLAN.response_s - STEP_S)
    assert cluster.nodes[node].schedulable
    assert injector.job_crashes > crashed  # jobs placed on the faulty GPU crashed as they started
    _run(cluster, injector, at + PLAN.response_s + STEP_S)
    assert cluster.nodes[node].drained  # the person drained it
    _run(cluster, injector, at + PLAN.response_s + PLAN.fix_s + 2 * STEP_S)
    assert not injector.state.faulty(node) and cluster.nodes[node].schedulable
    figures = injector.figures()
    assert figures.faults == 1 and figures.person_repairs == 1 and figures.unhealed == 0
    assert figures.hand_overs == 0  # no ladder without gpuops
    (to_quarantine,) = figures.to_quarantine_s
    assert PLAN.response_s <= to_quarantine <= PLAN.response_s + 2 * STEP_S
    (to_healthy,) = figures.to_healthy_s
    assert to_quarantine + PLAN.fix_s <= to_healthy <= to_quarantine + PLAN.fix_s + 2 * STEP_S
    assert figures.quarantines_true == figures.quarantines_false == 0
    assert figures.drain_gpu_hours > 0  # the person's drain stopped the node's other jobs
    # every GPU-second in one bucket at most: what was lost is within the fleet's time
    assert figures.lost_gpu_hours <= figures.capacity_gpu_hours
    assert figures.useful_share is not None and 0 < figures.useful_share < 1


def test_with_gpuops_the_fault_is_pushed_and_a_quarantine_counts_true_only_on_a_faulty_node() -> (
    None
):
    cluster = _busy_cluster()
    node, gpu = _busy_gpu(cluster)
    at = cluster.time + 30.0
    fault = InjectedFault(at, node, gpu, "hbm3", 48, Fix.RESET)
    injector = _injector(cluster, [fault], [], manual=False)
    _run(cluster, injector, at + STEP_S)
    (event,) = injector.take_events()
    assert (event.node, event.gpu, event.code, event.at) == (node, gpu, 48, at)
    assert injector.take_events() == []
    changed = ops.migrate(cluster, node)
    assert changed["drained"] is True
    quarantined_at = cluster.time
    injector.quarantined(node, quarantined_at, changed)
    other = next(n for n in cluster.nodes if n != node)
    injector.quarantined(other, cluster.time, {})
    assert ops.reset_gpu(cluster, gpu)["reset"] is True
    assert not injector.state.faulty(node)  # a reset heals an HBM fault that a reset heals
    ops.validate(cluster, node)
    ops.resume(cluster, node)
    _run(cluster, injector, cluster.time + RESET_S + VALIDATE_S + STEP_S)
    figures = injector.figures()
    assert (figures.quarantines_true, figures.quarantines_false) == (1, 1)
    assert figures.to_quarantine_s == (quarantined_at - at,)
    (to_healthy,) = figures.to_healthy_s
    out = quarantined_at - at + RESET_S + VALIDATE_S
    assert out <= to_healthy <= out + 2 * STEP_S
    assert figures.hand_overs == figures.person_repairs == figures.unhealed == 0
    assert figures.out_gpu_hours > 0  # the node out for the fault and the false quarantine


def test_a_handed_over_node_is_repaired_by_the_person_and_cleared_for_the_ladder() -> None:
    cluster = _busy_cluster()
    node, gpu = _busy_gpu(cluster)
    fault = InjectedFault(cluster.time + 1.0, node, gpu, "faulty_gpu", 79, Fix.REPLACE)
    injector = _injector(cluster, [fault], [], manual=False)
    _run(cluster, injector, fault.at + STEP_S)
    ops.migrate(cluster, node)
    assert ops.reboot(cluster, node)["rebooted"] is True
    with pytest.raises(Conflict, match="failed its health check: .*XID 79"):
        ops.validate(cluster, node)
    injector.hand_over(node, cluster.time)
    injector.hand_over(node, cluster.time)  # told again while it waits: once
    _run(cluster, injector, cluster.time + PLAN.response_s + PLAN.replace_s + STEP_S)
    assert injector.take_cleared() == [node]
    assert not injector.state.faulty(node)
    figures = injector.figures()
    assert figures.hand_overs == figures.person_repairs == 1


def test_with_gpuops_a_person_still_repairs_a_faulty_node_the_engine_left_in_service() -> None:
    cluster = _busy_cluster()
    node, gpu = _busy_gpu(cluster)
    fault = InjectedFault(cluster.time + 1.0, node, gpu, "hbm3", 48, Fix.RESET)
    injector = _injector(cluster, [fault], [], manual=False)
    _run(cluster, injector, fault.at + PLAN.response_s + STEP_S)  # nobody quarantined it
    assert cluster.nodes[node].drained
    figures = injector.figures()
    assert figures.person_repairs == 1 and figures.hand_overs == 0
    assert figures.quarantines_true == 0


def test_a_flood_of_application_xids_is_events_only() -> None:
    cluster = _busy_cluster()
    injector = _injector(cluster, [], [cluster.time + 1.0], manual=False)
    _run(cluster, injector, cluster.time + STEP_S)
    events = injector.take_events()
    running = [n for n in cluster.nodes.values() if not n.idle()]
    assert {e.code for e in events} == {45} and len(events) == len(running) > 1
    assert not injector.state.open or not any(injector.state.open.values())
    assert injector.figures().flood_events == len(events)


def test_the_fleets_remediation_steps_need_a_drained_idle_node_and_keep_it_out() -> None:
    cluster = _busy_cluster()
    node, gpu = _busy_gpu(cluster)
    for step in (lambda: ops.reset_gpu(cluster, gpu), lambda: ops.reboot(cluster, node)):
        with pytest.raises(Conflict, match=f"node {node} is not drained"):
            step()
    ops.migrate(cluster, node)
    start = cluster.time
    ops.reboot(cluster, node)
    assert cluster.nodes[node].booting_until == start + REBOOT_S
    assert ops.validate(cluster, node) == {"node": node, "passed": True}  # every node healthy
    ops.resume(cluster, node)
    assert not cluster.nodes[node].schedulable  # back when the steps would have ended
    while cluster.time < start + REBOOT_S + VALIDATE_S:
        cluster.advance(STEP_S)
    assert cluster.nodes[node].schedulable


def test_p95_is_the_nearest_rank() -> None:
    assert p95(()) is None
    assert p95((5.0,)) == 5.0
    assert p95(tuple(float(i) for i in range(1, 101))) == 95.0


def test_a_bad_plan_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="response_s must be a number >= 0"):
        FaultPlan(FaultRates(1.0), response_s=-1.0)


def _quarantine(node: str, changed: dict[str, object], expr: str = FAULT_TRIGGER) -> Decision:
    target = Target.from_labels({"node": node, "uuid": "GPU-1"}, None)
    return Decision(
        id=f"q-{node}",
        policy="quarantine-and-repair-faulty-gpu-node",
        group="health",
        target=target,
        transition=Transition.FIRE,
        action=ActionSpec("migrate", "scheduler", {}),
        evidence=Evidence(expr, None, 1000.0, 1030.0),
        at=1030.0,
        episode_start=1000.0,
    )


def test_the_what_ifs_listener_counts_a_quarantine_only_when_the_node_was_drained_by_it() -> None:
    cluster = _busy_cluster()
    node, gpu = _busy_gpu(cluster)
    fault = InjectedFault(10.0, node, gpu, "hbm3", 48, Fix.RESET)
    injector = _injector(cluster, [fault], [], manual=False)
    _run(cluster, injector, cluster.time + STEP_S)
    tally = _Tally(injector, start_s=1000.0)
    drained = Outcome(OutcomeStatus.SUCCESS, changed={"drained": True, "restart_gpu_s": 7200.0})
    tally(_quarantine(node, {}), drained)
    # drained already (by gpuops' earlier quarantine, or a person): not counted again
    tally(_quarantine(node, {}), Outcome(OutcomeStatus.SUCCESS, changed={"drained": False}))
    # a migrate no GpuFault alert triggered is not a quarantine
    tally(_quarantine("other", {}, expr="up == 0"), drained)
    reset = Decision(
        id="r",
        policy="quarantine-and-repair-faulty-gpu-node",
        group="health-ladder",
        target=Target.from_labels({"node": node}, None),
        transition=Transition.FIRE,
        action=ActionSpec("reset_gpu", "fleet", {}),
        evidence=Evidence("health ladder: reset_gpu", None, 1000.0, 1040.0),
        at=1040.0,
        episode_start=1000.0,
    )
    tally(reset, Outcome(OutcomeStatus.FAILURE, error="no"))
    tally(reset, Outcome(OutcomeStatus.SKIPPED, error="held by the kill switch"))
    figures = injector.figures()
    assert (figures.quarantines_true, figures.quarantines_false) == (1, 0)
    assert figures.drain_gpu_hours == pytest.approx(2.0)
    assert figures.to_quarantine_s == (30.0 - fault.at,)
    assert (figures.resets, figures.reboots) == (1, 0)  # a held step is no attempt
