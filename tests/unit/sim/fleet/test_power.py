"""Powering a fleet's machines down and up (the case study): pools' max_nodes, scale_in
of the node a policy found idle, the queue demand one more node could place, and arrivals
that do not depend on how finely time is stepped (the what-if's two runs get the same jobs)."""

from __future__ import annotations

import pytest

from gpuops.sim.fleet import Cluster, Conflict, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.collectors import FleetCollector
from gpuops.sim.fleet.config import ProjectSpec, SchedulerSettings
from gpuops.sim.fleet.model import POWERED_DOWN_KEPT_S
from gpuops.sim.fleet.workload import Arrivals, JobClass, PriorityClass

ROUTINE = PriorityClass("routine", 50, models=("T4",))


def cluster(nodes: int = 1, max_nodes: int | None = 3, reserved: int = 0) -> Cluster:
    return Cluster(
        FleetConfig(
            pools=(PoolSpec("t4", nodes, 4, "T4", max_nodes=max_nodes),),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=(ROUTINE,),
            reservations=(ProjectSpec("owner", (("t4", reserved),)),) if reserved else (),
            scheduler=SchedulerSettings(borrowing=False),
        )
    )


def job(project: str, gpus: int = 4) -> JobSpec:
    return JobSpec("training", gpus, project, pool="", duration_s=3600, priority_class="routine")


def test_scale_out_powers_up_to_max_nodes_then_refuses() -> None:
    c = cluster(nodes=1, max_nodes=3)
    assert ops.scale_out(c, "t4", 5)["added"] == ["node-1", "node-2"]
    with pytest.raises(Conflict, match=r"pool t4 has its 3 nodes \(max_nodes\) already"):
        ops.scale_out(c, "t4", 1)


def test_scale_out_without_max_nodes_is_unbounded() -> None:
    c = cluster(nodes=1, max_nodes=None)
    assert len(ops.scale_out(c, "t4", 4)["added"]) == 4  # type: ignore[arg-type]


def test_scale_in_of_a_named_node_removes_that_node_only_when_idle() -> None:
    c = cluster(nodes=3)
    busy = c.submit(job("a"))
    assert busy.node == "node-0"
    assert ops.scale_in(c, "t4", 1, node="node-1") == {"pool": "t4", "removed": ["node-1"]}
    assert ops.scale_in(c, "t4", 1, node="node-0") == {}  # a job holds it: nothing to do
    assert sorted(c.nodes) == ["node-0", "node-2"]


def test_demand_counts_queued_jobs_one_more_node_could_place() -> None:
    c = cluster(nodes=1, max_nodes=2)
    c.submit(job("a"))
    c.submit(job("b"))  # waits: the only node is full
    assert c.fleet_reading().demand == {"t4": 1}
    ops.scale_out(c, "t4", 1)
    assert c.jobs["job-2"].state == "running"
    c.submit(job("c"))  # waits, but the pool has no machine left to power up
    assert c.fleet_reading().demand == {"t4": 0}


def test_demand_leaves_out_jobs_the_pool_would_not_admit() -> None:
    # every GPU of the pool at full size is reserved by "owner": another project's job
    # would not be placed on a powered-up node (borrowing is off), so it is no demand
    c = cluster(nodes=1, max_nodes=2, reserved=8)
    c.submit(job("owner"))
    c.submit(job("other"))
    assert c.fleet_reading().demand == {"t4": 0}
    c.submit(job("owner"))
    assert c.fleet_reading().demand == {"t4": 1}


def test_a_pool_without_max_nodes_counts_demand_for_its_powered_down_machines() -> None:
    # its machines are the nodes it had: one powered down is there to power up again for
    # the queue (a pool with no demand would stay powered down with jobs waiting for it)
    c = cluster(nodes=2, max_nodes=None)
    assert ops.scale_in(c, "t4", 1, node="node-1") == {"pool": "t4", "removed": ["node-1"]}
    c.submit(job("a"))
    c.submit(job("b"))  # waits: the pool's other machine is powered down
    assert c.fleet_reading().demand == {"t4": 1}
    ops.scale_out(c, "t4", 1)
    assert c.jobs["job-2"].state == "running"
    c.submit(job("c"))  # waits, and both machines are up: nothing to power up for it
    assert c.fleet_reading().demand == {"t4": 0}


def test_a_quota_grants_nodes_are_not_machines_of_the_pool() -> None:
    c = cluster(nodes=1, max_nodes=None)
    c.scheduler.grant("g1", "a", "t4", 4, None)
    c.scheduler.release("g1")  # its node goes: no machine of the pool was powered down
    c.submit(job("a"))
    c.submit(job("b"))
    assert c.fleet_reading().demand == {"t4": 0}


def test_a_fully_reserved_pool_without_max_nodes_admits_its_owner_at_full_size() -> None:
    # every GPU reserved by "owner", half the machines powered down: the owner's job waits
    # for a machine of its own reservation, another project's would not be placed
    c = cluster(nodes=2, max_nodes=None, reserved=8)
    ops.scale_in(c, "t4", 1, node="node-1")
    c.submit(job("owner"))
    c.submit(job("other"))
    assert c.fleet_reading().demand == {"t4": 0}
    c.submit(job("owner"))
    assert c.fleet_reading().demand == {"t4": 1}


HIGH = PriorityClass("high", 100, models=("A100", "H100"))


def two_models(a100_nodes: int = 1) -> Cluster:
    """A100 machines (one of them up), H100 rentals (none up) and RTX machines (a fallback
    for the high class: not among its models), each pool booting in 5 minutes."""
    return Cluster(
        FleetConfig(
            pools=(
                PoolSpec("a100", a100_nodes, 4, "A100", max_nodes=2, boot_s=300),
                PoolSpec("h100", 0, 4, "H100", max_nodes=2, boot_s=180, cloud=True),
                PoolSpec("rtx", 0, 4, "RTXA6000", max_nodes=2, boot_s=300),
            ),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=(HIGH,),
            scheduler=SchedulerSettings(borrowing=False, min_runtime_s=0.0),
        )
    )


def high(gpus: int = 4) -> JobSpec:
    return JobSpec("training", gpus, "ai", pool="", duration_s=36000, priority_class="high")


def test_a_machine_booting_in_a_full_pool_takes_its_job_from_the_other_pools_too() -> None:
    c = two_models()
    c.submit(high())
    c.submit(high())  # waits: node-0 is full
    assert c.fleet_reading().demand == {"a100": 1, "h100": 0, "rtx": 0}
    ops.scale_out(c, "a100", 1)  # the pool's last machine: a100 is at max_nodes now
    # the booting A100 machine will take the job: no H100 rented for it as well (it was:
    # a pool at max_nodes was passed over before the machines booting in it were counted)
    assert c.fleet_reading().demand == {"a100": 0, "h100": 0, "rtx": 0}


def test_a_fallback_pools_machine_powers_up_only_for_a_job_that_waited_its_boot() -> None:
    c = two_models()
    c.submit(high())
    ops.scale_out(c, "h100", 2)
    c.advance(180.0)  # the rentals are up
    c.submit(high())
    c.submit(high())
    waiting = c.submit(high())  # the A100 and H100 machines are all taken
    assert waiting.state == "queued"
    c.advance(240.0)
    # the RTX pool is not of the class's models: GPUs of its own free up as often as not
    # within a boot, so its machine waits as long as it takes to boot (300 s)
    assert c.fleet_reading().demand == {"a100": 1, "h100": 0, "rtx": 0}
    ops.scale_out(c, "a100", 1)
    c.submit(high())  # a fifth: only the RTX pool has machines left
    c.advance(60.0)
    assert c.fleet_reading().demand == {"a100": 0, "h100": 0, "rtx": 0}
    c.advance(240.0)
    assert c.fleet_reading().demand == {"a100": 0, "h100": 0, "rtx": 1}


def test_a_preempted_jobs_wait_for_a_fallback_machine_counts_from_its_preemption() -> None:
    c = two_models(a100_nodes=2)
    ops.scale_out(c, "h100", 2)
    c.advance(180.0)
    jobs = [c.submit(high()) for _ in range(4)]  # every A100 and H100 GPU taken
    c.advance(3000.0)  # submitted long ago
    held = list(jobs[0].gpu_uuids)
    c.scheduler.preempt(jobs[0])
    c.submit(JobSpec("training", 4, "ai", pool="", duration_s=36000, priority_class="high",
                     gpu_uuids=tuple(held)))  # fmt: skip
    assert jobs[0].state == "queued"
    assert c.fleet_reading().demand == {"a100": 0, "h100": 0, "rtx": 0}  # it just queued
    c.advance(300.0)
    assert c.fleet_reading().demand == {"a100": 0, "h100": 0, "rtx": 1}


def test_a_booting_machine_is_counted_for_the_job_the_scheduler_will_give_it_to() -> None:
    c = Cluster(
        FleetConfig(
            pools=(
                PoolSpec("x", 1, 4, "A100", max_nodes=2, boot_s=300),
                PoolSpec("y", 0, 4, "H100", max_nodes=2, boot_s=180, cloud=True),
            ),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=(
                PriorityClass("low", 10, models=("A100", "H100")),
                PriorityClass("high", 100, models=("A100",)),
            ),
            scheduler=SchedulerSettings(borrowing=False, preemption=False),
        )
    )
    spec = {"pool": "", "duration_s": 36000}
    c.submit(JobSpec("training", 4, "p", priority_class="low", **spec))  # type: ignore[arg-type]
    c.submit(JobSpec("training", 4, "p", priority_class="low", **spec))  # type: ignore[arg-type]
    c.submit(JobSpec("training", 4, "p", priority_class="high", **spec))  # type: ignore[arg-type]
    ops.scale_out(c, "x", 1)  # the high job, placed first, will take it: the low one needs y
    assert c.fleet_reading().demand == {"x": 0, "y": 1}


def test_a_job_with_no_pool_of_its_classs_models_does_not_wait_for_a_fallback() -> None:
    c = two_models()
    c.submit(high())
    big = JobSpec("training", 4, "ai", pool="rtx", duration_s=36000, priority_class="high")
    c.submit(big)  # it names the RTX pool: nothing of its models to wait for
    assert c.fleet_reading().demand == {"a100": 0, "h100": 0, "rtx": 1}


def test_arrivals_are_the_same_however_finely_time_is_stepped() -> None:
    classes = (
        JobClass("train", "a", "routine", "training", 6.0, gpus=((1, 0.5), (2, 0.5))),
        JobClass("nb", "b", "routine", "notebook", 3.0, diurnal=(0.5, 1.5) * 12),
    )

    def drawn(step_s: float) -> list[tuple[float, str, int, float | None]]:
        arrivals = Arrivals(classes, 7, start_hour=9)
        out = []
        t = 0.0
        while t < 6 * 3600:
            t += step_s
            for at, jc in arrivals.due(t):
                spec = arrivals.spec(jc, ROUTINE)
                out.append((at, jc.name, spec.gpus, spec.duration_s))
        return out

    fine, coarse = drawn(15.0), drawn(3600.0)
    assert len(fine) > 20
    assert fine == coarse


def test_a_powered_down_node_is_exported_as_such_for_an_hour() -> None:
    c = cluster(nodes=3)
    ops.scale_in(c, "t4", 1, node="node-1")
    assert c.fleet_reading().powered_down == (("node-1", "t4"),)
    families = {f.name: f for f in FleetCollector(c).collect()}
    [sample] = families["gpuops_node_powered_down"].samples
    assert (sample.labels, sample.value) == ({"node": "node-1", "pool": "t4"}, 1.0)
    c.advance(POWERED_DOWN_KEPT_S + 1)
    assert c.fleet_reading().powered_down == ()  # gone from the page's hour as well
    ops.scale_in(c, "t4", 1, node="node-2")  # and forgotten: what is kept stays bounded
    assert list(c.powered_down) == ["node-2"]
