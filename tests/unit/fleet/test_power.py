"""Powering a fleet's machines down and up (issue 12's case study): pools' max_nodes, scale_in
of the node a policy found idle, the queue demand one more node could place, and arrivals
that do not depend on how finely time is stepped (the what-if's two runs get the same jobs)."""

from __future__ import annotations

import pytest

from exporters.fleet import Cluster, Conflict, FleetConfig, JobSpec, PoolSpec
from exporters.fleet import operations as ops
from exporters.fleet.config import ProjectSpec, SchedulerSettings
from exporters.fleet.workload import Arrivals, JobClass, PriorityClass

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
