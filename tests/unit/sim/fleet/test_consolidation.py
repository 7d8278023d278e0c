"""Consolidation of the simulated fleet: ``consolidate`` empties a partly used node
onto other nodes' free GPUs and powers it down, charging each job's restart; what it refuses,
and the ``gpuops_node_drainable`` signal that the case study's policy reads."""

from __future__ import annotations

import pytest

from gpuops.sim.fleet import Cluster, Conflict, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.config import ProjectSpec, SchedulerSettings
from gpuops.sim.fleet.model import SESSION_IDLE_S
from gpuops.sim.fleet.report import Recorder
from gpuops.sim.fleet.workload import PriorityClass

CLASSES = (PriorityClass("high", 100), PriorityClass("routine", 50))
POOL = PoolSpec("a", 3, 4, "A100", max_nodes=3, boot_s=300)
SLICED = PoolSpec("r", 2, 2, "RTXA6000", sharing="time-slicing", slices=4)


def cluster(*pools: PoolSpec) -> Cluster:
    return Cluster(
        FleetConfig(
            pools=pools or (POOL,),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=CLASSES,
            scheduler=SchedulerSettings(
                borrowing=False, min_runtime_s=0.0, restart_s=300.0, move_interval_s=3600.0
            ),
        )
    )


def training(gpus: int, node: str, checkpoint_s: float | None = 1800.0) -> JobSpec:
    return JobSpec(
        "training", gpus, "p", pool="", duration_s=7200.0, priority_class="high",
        node=node, checkpoint_interval_s=checkpoint_s,
    )  # fmt: skip


def notebook(node: str = "") -> JobSpec:
    return JobSpec(
        "notebook", 1, "p", pool="", duration_s=4 * 3600.0, priority_class="routine",
        shareable=True, node=node or None,
    )  # fmt: skip


def drainable(c: Cluster) -> dict[str, int]:
    return {node: ok for node, _pool, ok in c.fleet_reading().drainable}


def steps(c: Cluster, seconds: float) -> None:
    for _ in range(int(seconds // 15)):
        c.advance(15.0)


def test_consolidate_moves_the_jobs_best_fit_charges_restarts_and_powers_the_node_down() -> None:
    c = cluster()
    big = c.submit(training(3, "node-0"))  # node-0: 1 GPU free
    pair = c.submit(training(2, "node-1"))  # node-1: 2 free
    small = c.submit(training(1, "node-2"))  # node-2: a quarter used
    other = c.submit(training(1, "node-2"))
    steps(c, 20 * 60)  # 20 minutes of work, no checkpoint yet (every 30 min)
    assert drainable(c) == {"node-0": 0, "node-1": 0, "node-2": 1}
    changed = ops.consolidate(c, "node-2")
    assert "node-2" not in c.nodes and changed["powered_down"] is True
    # best fit: the fuller node-0 takes one job, node-1 the other
    assert {m["to"] for m in changed["moved"]} == {"node-0", "node-1"}  # type: ignore[union-attr]
    assert {small.node, other.node} == {"node-0", "node-1"}
    # each lost its 20 minutes since the last checkpoint, plus the 5-minute restart
    assert changed["restart_gpu_s"] == pytest.approx(2 * 1500.0, abs=40.0)
    # the 20 minutes go back on its remaining time; the 5 minutes it relaunches, idle
    assert small.remaining_s == pytest.approx(7200.0 - 1200.0 + 1200.0, abs=20.0)
    assert small.restarting_until == c.time + 300.0
    assert small.moved_at == c.time and big.moved_at is None
    assert c.state()["counters"]["consolidated"] == 1  # type: ignore[index]
    c.release(pair)  # node-1 holds only the job moved there now: it may not move again yet
    assert drainable(c) == {"node-0": 0, "node-1": 0}
    with pytest.raises(Conflict, match=r"moved 0 min ago; not again within 60 min"):
        ops.consolidate(c, "node-1")


def test_consolidate_refuses_what_would_lose_work_or_not_empty_the_node() -> None:
    c = cluster()
    c.submit(training(3, "node-0"))
    with pytest.raises(Conflict, match="more than half"):
        ops.consolidate(c, "node-0")
    with pytest.raises(Conflict, match="idle: nothing to move"):
        ops.consolidate(c, "node-2")
    lossy = c.submit(training(1, "node-1", checkpoint_s=None))
    with pytest.raises(Conflict, match=f"job {lossy.id} has no checkpoints"):
        ops.consolidate(c, "node-1")
    c.release(lossy)
    c.submit(training(2, "node-1"))
    c.submit(training(2, "node-2"))
    # node-1 and node-2 each hold 2 GPUs: node-0 has 1 free, the other half node 2 — either
    # could move onto the other, but not both: only the first of the pass is drainable
    assert sorted(drainable(c).values()) == [0, 0, 1]
    c.submit(training(1, "node-0"))
    c.submit(training(2, "node-2"))  # node-2 full: node-1's job has nowhere to go
    with pytest.raises(Conflict, match="no other node of pool a has room"):
        ops.consolidate(c, "node-1")
    assert c.nodes["node-1"].schedulable  # refused: left as it was


def test_a_job_on_slices_moves_onto_a_slice_of_another_shared_gpu() -> None:
    c = cluster(SLICED)
    first = c.submit(notebook("node-0"))
    ops.pack(c, first.gpu_uuids[0])  # node-0's first GPU shared in place
    c.submit(notebook())  # onto its free slice
    third = c.submit(notebook())  # and the next: 3 x 14.4 GB fill a 48 GB RTX A6000
    lone = c.submit(notebook("node-1"))
    ops.pack(c, lone.gpu_uuids[0])  # no room on node-0: node-1's GPU shared in place
    c.release(third)  # room for one more notebook on node-0's shared GPU
    steps(c, SESSION_IDLE_S)  # sessions without checkpoints move only once seen idle
    # either node could go onto the other's shared GPU, not both: the newest first
    assert drainable(c) == {"node-0": 0, "node-1": 1}
    changed = ops.consolidate(c, "node-1")
    assert lone.shared and lone.node == "node-0" and lone.gpu_uuids == first.gpu_uuids
    assert changed["restart_gpu_s"] == pytest.approx(300.0)  # a session loses no work
    gpu = c.find_gpu(first.gpu_uuids[0])[1]
    assert len(gpu.tenants) == 3 and "node-1" not in c.nodes


def test_a_quota_grants_node_is_never_a_target() -> None:
    c = cluster()
    c.submit(training(4, "node-0"))
    c.submit(training(4, "node-1"))
    lone = c.submit(training(1, "node-2"))
    grant = ops.grant_quota(c, "p", "g-1", "a", 4, None)["grant"]
    assert grant["nodes"] == ["node-3"]  # type: ignore[index]
    # only the grant's node has room, and it goes when the grant ends: node-2 stays
    assert drainable(c)["node-2"] == 0
    with pytest.raises(Conflict, match="no other node of pool a has room"):
        ops.consolidate(c, "node-2")
    c.submit(training(1, "node-3"))
    with pytest.raises(Conflict, match="holds a quota grant"):
        ops.consolidate(c, "node-3")
    assert lone.node == "node-2"


def test_an_idle_node_is_never_a_target() -> None:
    c = cluster()
    c.submit(training(4, "node-0"))  # node-0 full
    lone = c.submit(training(1, "node-1"))  # node-2 idle: moving there would save nothing
    assert drainable(c)["node-1"] == 0
    with pytest.raises(Conflict, match="no other node of pool a has room"):
        ops.consolidate(c, "node-1")
    assert lone.node == "node-1" and c.restart_lost_gpu_s == 0.0


def test_pack_and_consolidate_do_not_move_a_job_back_and_forth() -> None:
    c = cluster(PoolSpec("r", 3, 2, "RTXA6000", sharing="time-slicing", slices=4))
    first = c.submit(notebook("node-0"))
    ops.pack(c, first.gpu_uuids[0])  # node-0's GPU shared in place
    c.submit(notebook("node-1"))
    b = c.submit(notebook("node-1"))
    assert ops.pack(c, b.gpu_uuids[0])["to"] == "node-0"  # restarted onto node-0's slice
    assert b.moved_at == c.time
    steps(c, SESSION_IDLE_S)  # idle notebooks: movable but for the interval
    # node-1 (one GPU still free) could take node-0's two notebooks back: not b, not yet
    with pytest.raises(Conflict, match=f"job {b.id} was moved 10 min ago"):
        ops.consolidate(c, "node-0")
    assert drainable(c)["node-0"] == 0 and b.node == "node-0"
    # the other way round: a job consolidation moved is only shared in place by pack
    c2 = cluster(PoolSpec("r", 3, 2, "RTXA6000", sharing="time-slicing", slices=4))
    c2.submit(notebook("node-0"))
    moved = c2.submit(notebook("node-1"))
    shared = c2.submit(notebook("node-2"))
    ops.pack(c2, shared.gpu_uuids[0])  # node-2's first GPU shared, a slice free
    c2.submit(notebook("node-2"))  # node-2 full: node-0's free GPU is the only target
    steps(c2, SESSION_IDLE_S)
    ops.consolidate(c2, "node-1")
    assert moved.node == "node-0" and moved.moved_at == c2.time
    ops.pack(c2, moved.gpu_uuids[0])  # without the interval: restarted onto node-2's slice
    assert moved.node == "node-0" and moved.shared


def test_a_node_that_takes_anothers_jobs_is_not_drainable_in_the_same_pass() -> None:
    c = cluster(PoolSpec("a", 4, 4, "A100", max_nodes=4, boot_s=300))
    c.submit(training(1, "node-0"))
    c.submit(training(2, "node-1"))
    c.submit(training(4, "node-2"))
    c.submit(training(2, "node-3"))
    # node-0's job goes onto node-1 (best fit): node-1 must stay up for it, though on its
    # own it could drain onto node-3; both plans at once would end in a 409 or "no room"
    assert [m.node.name for m in c.scheduler.drain_plan(c.nodes["node-0"])] == ["node-1"]
    assert drainable(c) == {"node-0": 1, "node-1": 0, "node-2": 0, "node-3": 0}
    ops.consolidate(c, "node-0")
    assert sorted(c.nodes) == ["node-1", "node-2", "node-3"]


def test_a_notebook_moves_only_once_idle_a_service_in_use_pays_its_relaunch() -> None:
    c = cluster()
    c.submit(training(3, "node-0"))
    notes = c.submit(notebook("node-2"))  # ~2 % load: nobody at it
    with pytest.raises(
        Conflict,
        match=rf"job {notes.id} \(notebook session, no checkpoints\) was in use 0 min ago: a "
        "session moves only after 10 min idle",
    ):
        ops.consolidate(c, "node-2")
    assert drainable(c)["node-2"] == 0
    steps(c, SESSION_IDLE_S)
    assert drainable(c)["node-2"] == 1
    ops.consolidate(c, "node-2")
    assert notes.node == "node-0"
    c.release(notes)
    # a service is restarted elsewhere like a Deployment's pod (its clients see the relaunch)
    service = c.submit(
        JobSpec("inference", 1, "p", pool="", duration_s=8 * 3600.0, node="node-1")
    )  # bursty: busy every minute or so, no checkpoints
    steps(c, 2 * SESSION_IDLE_S)
    assert service.busy_at is not None and c.time - service.busy_at < SESSION_IDLE_S
    left = service.remaining_s
    assert drainable(c)["node-1"] == 1
    out = ops.consolidate(c, "node-1")
    assert service.node == "node-0" and out["restart_gpu_s"] == c.config.scheduler.restart_s
    assert service.remaining_s == left  # its serving time goes on: no work lost
    assert service.restarting_until == c.time + c.config.scheduler.restart_s


def test_a_restarted_job_relaunches_on_idle_gpus_and_its_redone_work_is_counted() -> None:
    c = cluster()
    c.submit(training(3, "node-0"))
    job = c.submit(training(1, "node-2"))
    steps(c, 20 * 60)  # 20 minutes since its last checkpoint
    ops.consolidate(c, "node-2")
    gpu = c.find_gpu(job.gpu_uuids[0])[1]
    left = job.remaining_s
    c.advance(15.0)
    # relaunching: the GPU is held but idle and the job makes no progress
    assert gpu.utilization == 0.0 and job.remaining_s == left
    steps(c, 300.0)
    assert job.restarting_until is None and gpu.utilization > 0.8
    assert job.remaining_s < left and job.redo_s == pytest.approx(1200.0 - 15.0, abs=20.0)
    recorder = Recorder()
    for _ in range(int(1200 // 15)):  # the 20 minutes done again, at ~90 % load
        recorder.observe(c)
        c.advance(15.0)
    recorder.observe(c)
    assert job.redo_s == 0.0
    assert c.redo_busy_gpu_s == pytest.approx(0.9 * 1200.0, rel=0.06)
    report = recorder.report(c)
    # 8 powered GPUs for 20 min, 4 of them busy; the moved job's was busy doing work again
    assert report.utilization_powered == pytest.approx(4 * 0.9 / 8, rel=0.06)
    assert report.utilization_powered_net == pytest.approx(3 * 0.9 / 8, rel=0.06)


# --- across pools: a job moves to another pool of its class's models, as admitted there ---

TRAINING = PriorityClass("high", 100, models=("A100", "H100"))


def pools(*reserved: tuple[str, str, int], a_nodes: int = 2) -> Cluster:
    """Pool a (A100; node-0, node-1 with the defaults), pool h (H100, rented; the next node),
    pool r (RTX A6000, a fallback of the class; the last node)."""
    return Cluster(
        FleetConfig(
            pools=(
                PoolSpec("a", a_nodes, 4, "A100", max_nodes=a_nodes),
                PoolSpec("h", 1, 4, "H100", cloud=True, max_nodes=2),
                PoolSpec("r", 1, 4, "RTXA6000"),
            ),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=(TRAINING,),
            reservations=tuple(ProjectSpec(p, ((pool, n),)) for p, pool, n in reserved),
            scheduler=SchedulerSettings(
                borrowing=False, min_runtime_s=0.0, restart_s=300.0, move_interval_s=3600.0
            ),
        )
    )


def trains(gpus: int, node: str = "", project: str = "p") -> JobSpec:
    """A training; pinned to ``node`` (its pool only), else placed by the scheduler."""
    return JobSpec(
        "training", gpus, project, pool="", duration_s=7200.0, priority_class="high",
        node=node or None, checkpoint_interval_s=1800.0,
    )  # fmt: skip


def test_a_rented_nodes_job_moves_to_free_gpus_of_the_classs_first_model() -> None:
    c = pools(a_nodes=1)
    full = c.submit(trains(4))  # node-0 (A100) full
    job = c.submit(trains(1))  # so it goes to node-1 (H100, rented)
    assert job.node == "node-1" and job.pools == ("a", "h", "r")  # r only by fallback
    c.release(full)
    c.submit(trains(3))  # node-0: one GPU free
    assert drainable(c)["node-1"] == 1
    out = ops.consolidate(c, "node-1")
    assert "node-1" not in c.nodes and job.node == "node-0" and not job.borrowed
    assert out["moved"] == [{"job": job.id, "to": "node-0", "pool": "a", "gpus": job.gpu_uuids}]


def test_no_move_to_a_fallback_pool_nor_onto_quota_reserved_for_another_project() -> None:
    c = pools(("o", "h", 4))
    c.submit(trains(4))  # node-0 (A100): full
    job = c.submit(trains(1))  # node-1 (A100): a quarter used
    c.submit(trains(1, "node-2", project="o"))  # node-2 (H100, o's): 3 GPUs free
    c.submit(trains(1, "node-3"))  # node-3 (RTX, a fallback pool of the job): 3 GPUs free
    assert job.node == "node-1"
    with pytest.raises(Conflict, match=rf"no other node of pools a, h has room for job {job.id}"):
        ops.consolidate(c, "node-1")
    assert drainable(c)["node-1"] == 0 and job.node == "node-1"


def test_moves_of_one_pass_never_count_on_the_same_unreserved_gpus() -> None:
    # pool h: 4 GPUs, o reserves 3, so one is unreserved; node-1's two jobs need two
    c = pools(("o", "h", 3))
    c.submit(trains(4))  # node-0 full
    first, second = c.submit(trains(1)), c.submit(trains(1))  # node-1: half used
    c.submit(trains(1, "node-2", project="o"))  # H100 node-2: 3 free, 1 of them unreserved
    assert first.node == second.node == "node-1"
    with pytest.raises(Conflict, match="no other node of pools a, h has room"):
        ops.consolidate(c, "node-1")
    c.release(second)
    assert drainable(c)["node-1"] == 1
    ops.consolidate(c, "node-1")
    assert first.node == "node-2" and not first.borrowed


def test_no_move_to_a_pool_a_queued_job_waits_for() -> None:
    c = pools(a_nodes=1)
    job = c.submit(trains(1))  # node-0 (A100), a quarter used
    c.submit(trains(1, "node-1"))  # node-1 (H100): 3 free
    c.submit(trains(1, "node-2"))  # node-2 (RTX): 3 free
    assert job.node == "node-0" and drainable(c)["node-0"] == 1
    waiting = c.submit(trains(4))  # fits nowhere now: it waits, for pools a, h and r
    assert waiting.state == "queued"
    assert drainable(c)["node-0"] == 0
    with pytest.raises(Conflict, match="no other node of pools a, h has room"):
        ops.consolidate(c, "node-0")
    assert job.node == "node-0"


def test_a_borrowing_job_moved_to_unreserved_gpus_of_another_pool_borrows_no_more() -> None:
    c = pools(("o", "a", 8))
    c.scheduler.lend("a")  # o's idle A100s lent: p's job borrows one
    job = c.submit(trains(1))
    assert job.node == "node-0" and job.borrowed
    c.submit(trains(1, "node-2"))  # node-2 (H100, nobody's): 3 free
    ops.consolidate(c, "node-0")
    assert job.node == "node-2" and not job.borrowed  # o cannot take back what is not its


def test_a_job_on_slices_never_moves_onto_a_slice_of_another_pool_too_small_for_it() -> None:
    c = Cluster(
        FleetConfig(
            pools=(
                PoolSpec("t", 1, 2, "A100", sharing="time-slicing", slices=4),
                PoolSpec("m", 1, 2, "H100", sharing="mig", slices=7),  # 11.4 GiB slices
            ),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=(PriorityClass("routine", 50, models=("A100", "H100")),),
            scheduler=SchedulerSettings(borrowing=False, min_runtime_s=0.0, restart_s=300.0),
        )
    )
    notes = c.submit(notebook())  # 30 % of a GPU's memory: 24 GiB of an 80 GB one
    assert notes.node == "node-0" and notes.pools == ("t", "m")
    ops.pack(c, notes.gpu_uuids[0])
    assert notes.shared
    c.submit(
        JobSpec(
            "training",
            1,
            "q",
            pool="",
            duration_s=7200.0,
            priority_class="routine",
            node="node-1",
            checkpoint_interval_s=1800.0,
        )  # fmt: skip
    )  # node-1 (H100, MIG): one GPU free
    steps(c, SESSION_IDLE_S)  # the notebook idle: movable
    with pytest.raises(Conflict, match=rf"no other node of pools t, m has room for job {notes.id}"):
        ops.consolidate(c, "node-0")
    assert drainable(c)["node-0"] == 0 and notes.node == "node-0"
