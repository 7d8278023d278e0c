"""The scheduler: affinity with fallback, memory fit, quotas with borrowing and reclaim,
preemption with compensation and its limits, elastic grants that end cleanly, holds."""

from __future__ import annotations

import pytest

from gpuops.sim.fleet import Cluster, Conflict, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.config import ProjectSpec, SchedulerSettings
from gpuops.sim.fleet.workload import PriorityClass

CLASSES = (
    PriorityClass("high", 100, models=("H100",), preempts=True, preemptible=False),
    PriorityClass("strict", 90, models=("H100",), fallback=False),
    PriorityClass("routine", 50, models=("T4",)),
    PriorityClass("batch", 10, holdable=True),
)


def cluster(*pools: PoolSpec, reserved: dict[str, int] | None = None, **sched: object) -> Cluster:
    pools = pools or (PoolSpec("a", 2, 4, "A100"),)
    owners = tuple(
        ProjectSpec(project, ((pools[0].name, gpus),)) for project, gpus in (reserved or {}).items()
    )
    settings = {"min_runtime_s": 0.0, **sched}
    return Cluster(
        FleetConfig(
            pools=pools,
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=CLASSES,
            reservations=owners,
            scheduler=SchedulerSettings(**settings),  # type: ignore[arg-type]
        )
    )


def job(project: str, gpus: int, cls: str = "routine", **kw: object) -> JobSpec:
    return JobSpec("training", gpus, project, pool="", duration_s=3600, priority_class=cls, **kw)  # type: ignore[arg-type]


def pool_of(c: Cluster, job_id: str) -> str:
    return c.nodes[str(c.jobs[job_id].node)].pool


def test_affinity_prefers_the_class_models_and_falls_back() -> None:
    c = cluster(PoolSpec("h100", 1, 4, "H100"), PoolSpec("t4", 1, 4, "T4"))
    first = c.submit(job("p", 4, "high"))
    second = c.submit(job("p", 4, "high"))
    assert (pool_of(c, first.id), pool_of(c, second.id)) == ("h100", "t4")
    routine = c.submit(job("p", 1, "routine"))
    assert routine.state == "queued" and routine.pools == ("t4", "h100")


def test_strict_affinity_and_memory_fit_keep_a_job_queued() -> None:
    c = cluster(PoolSpec("h100", 1, 4, "H100"), PoolSpec("t4", 1, 4, "T4"))
    c.submit(job("p", 4, "high"))
    strict = c.submit(job("p", 1, "strict"))
    big = c.submit(job("q", 1, "routine", memory_gib=40))
    assert strict.pools == ("h100",) and strict.state == "queued"
    assert big.pools == ("h100",) and big.state == "queued"  # 40 GiB does not fit a 16 GiB T4


def test_borrowed_gpus_are_reclaimed_by_their_owner_with_compensation() -> None:
    c = cluster(reserved={"owner": 8}, borrowing=True)
    guest = c.submit(job("guest", 4, checkpoint_interval_s=600.0))
    assert guest.state == "running" and guest.borrowed
    c.advance(900.0)  # 15 min of work: 5 min since the last checkpoint
    mine = c.submit(job("owner", 4))
    other = c.submit(job("owner", 4))
    assert mine.state == other.state == "running" and not mine.borrowed
    assert guest.state == "queued" and guest.front and guest.preemptions == 1
    assert guest.remaining_s == pytest.approx(3600 - 900 + 300)
    assert c.scheduler.credit_gpu_s["guest"] == pytest.approx(300 * 4)


def test_without_borrowing_reserved_gpus_wait_for_their_owner() -> None:
    c = cluster(reserved={"owner": 8}, borrowing=False)
    guest = c.submit(job("guest", 1))
    assert guest.state == "queued"
    assert c.submit(job("owner", 4)).state == "running"


def test_minimum_runtime_and_preemption_cap_protect_a_job() -> None:
    c = cluster(reserved={"owner": 8}, min_runtime_s=600.0, max_preemptions=1)
    c.submit(job("owner", 4))
    guest = c.submit(job("guest", 4))
    assert guest.borrowed
    c.advance(60.0)
    second = c.submit(job("owner", 4))
    assert second.state == "queued" and guest.state == "running"  # guest ran only 1 min
    c.advance(600.0)
    assert second.state == "running" and guest.state == "queued" and guest.preemptions == 1
    ops.reclaim(c, c.nodes[str(second.node)].gpus[0].uuid)  # requeued, ahead of nobody
    # at its cap the guest is never preempted again, so it borrows no more: its owner could
    # never take the GPUs back (it waits for room its own quota or unreserved GPUs give);
    # the owner's reclaimed job, behind it in the queue, gets its GPUs again
    assert guest.state == "queued" and not guest.borrowed and guest.preemptions == 1
    assert second.state == "running"


def test_priority_preemption_only_of_preemptible_lower_classes() -> None:
    c = cluster(PoolSpec("h100", 1, 4, "H100"))
    low = c.submit(job("p", 4, "batch"))
    high = c.submit(job("q", 4, "high"))
    assert high.state == "running" and low.state == "queued"
    assert c.submit(job("r", 4, "high")).state == "queued"  # high is not preemptible


def test_a_grant_raises_that_projects_quota_and_its_release_removes_exactly_its_nodes() -> None:
    c = cluster(PoolSpec("a", 1, 4, "A100"), reserved={"owner": 4}, borrowing=True)
    c.submit(job("owner", 4))
    changed = ops.grant_quota(c, "nlp", "req-1", "a", 4, None)
    added = changed["grant"]["nodes"]  # type: ignore[index]
    assert added == ["node-1"] and c.scheduler.quota("nlp", "a") == 4
    guest = c.submit(job("guest", 2))  # another project's job lands on the granted node
    assert guest.node == "node-1" and guest.borrowed
    released = ops.release_quota(c, "nlp", "req-1")
    assert released["removed"] == ["node-1"] and released["requeued"] == [guest.id]
    assert "node-1" not in c.nodes and c.scheduler.quota("nlp", "a") == 0
    assert guest.state == "queued" and guest.preemptions == 1
    assert ops.release_quota(c, "nlp", "req-1") == {}  # a retry is a no-op
    with pytest.raises(Conflict):
        ops.grant_quota(c, "nlp", "req-1", "a", 4, None)  # an ended grant is not re-applied


def test_a_grant_with_a_duration_ends_by_itself() -> None:
    c = cluster(PoolSpec("a", 1, 4, "A100"))
    ops.grant_quota(c, "nlp", "req-2", "a", 6, 3600.0)
    assert len(c.nodes) == 3
    mine = c.submit(job("nlp", 4))
    c.advance(3601.0)
    assert len(c.nodes) == 1 and not c.scheduler.grants
    assert mine.state in ("queued", "running") and mine.node in (None, "node-0")


def test_held_class_waits_until_released() -> None:
    c = cluster()
    assert ops.hold_class(c, "batch") == {"priority_class": "batch", "held": True}
    held = c.submit(job("p", 1, "batch"))
    assert held.state == "queued"
    assert ops.hold_class(c, "batch") == {}
    ops.release_class(c, "batch")
    assert held.state == "running"
    with pytest.raises(Conflict):
        ops.hold_class(c, "routine")


def test_scale_in_leaves_a_grants_nodes_to_its_release() -> None:
    c = cluster(PoolSpec("a", 1, 4, "A100"))
    c.submit(job("p", 4))  # node-0 busy
    ops.grant_quota(c, "nlp", "req-3", "a", 4, None)  # node-1, idle
    assert ops.scale_in(c, "a", 1) == {}
    assert set(c.nodes) == {"node-0", "node-1"}
    assert ops.release_quota(c, "nlp", "req-3")["removed"] == ["node-1"]


def test_arrival_rate_scales_a_fleet_files_classes() -> None:
    from gpuops.sim.fleet.workload import JobClass

    def run(rate: float | None) -> int:
        c = Cluster(
            FleetConfig(
                pools=(PoolSpec("a", 8, 8, "A100"),),
                initial_jobs=(),
                priority_classes=CLASSES,
                job_classes=(JobClass("j", "p", "routine", rate_per_hour=60.0),),
            )
        )
        assert c.arrival_rate_per_min == 1.0
        if rate is not None:
            c.set_arrival_rate(rate)
        c.advance(3600.0)
        return c._job_seq

    assert run(0.0) == 0
    assert 35 < run(None) < 85 and 90 < run(2.0) < 150  # Poisson: 60 and 120 expected
