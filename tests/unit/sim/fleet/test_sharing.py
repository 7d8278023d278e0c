"""GPU sharing, lending, reclaim-with-requeue and boot delays of the simulated fleet:
what ``pack``, ``lend``/``unlend``, ``reclaim`` and ``scale_out`` change, and what they charge."""

from __future__ import annotations

import pytest

from gpuops.sim.fleet import Cluster, Conflict, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.config import GIB, ProjectSpec, SchedulerSettings
from gpuops.sim.fleet.sharing import TIME_SLICING_OVERHEAD, fits, gpu_utilization, progress_rates
from gpuops.sim.fleet.workload import PriorityClass

CLASSES = (PriorityClass("routine", 50),)
SLICED = PoolSpec("v", 1, 2, "V100", sharing="time-slicing", slices=4, max_nodes=2, boot_s=300)


def cluster(*pools: PoolSpec, reserved: dict[str, int] | None = None) -> Cluster:
    pools = pools or (SLICED,)
    owners = tuple(
        ProjectSpec(project, ((pools[0].name, gpus),)) for project, gpus in (reserved or {}).items()
    )
    return Cluster(
        FleetConfig(
            pools=pools,
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=CLASSES,
            reservations=owners,
            scheduler=SchedulerSettings(borrowing=False, min_runtime_s=0.0, restart_s=300.0),
        )
    )


def light(
    project: str = "p",
    shareable: bool = True,
    memory_gib: float = 12,
    gpus: int = 1,
    priority_class: str = "routine",
    **kw: object,
) -> JobSpec:
    return JobSpec(
        "light", gpus, project, pool="", duration_s=3600.0, priority_class=priority_class,
        memory_gib=memory_gib, shareable=shareable, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_time_slicing_adds_demands_and_slows_only_beyond_the_gpu() -> None:
    assert gpu_utilization("time-slicing", [0.25, 0.25], 4) == 0.5
    assert progress_rates("time-slicing", [0.25], 4) == [1.0]
    assert progress_rates("time-slicing", [0.25, 0.25], 4) == [1 - TIME_SLICING_OVERHEAD] * 2
    slowed = progress_rates("time-slicing", [0.8, 0.8], 4)
    assert slowed[0] == pytest.approx((1 - TIME_SLICING_OVERHEAD) / 1.6)
    assert gpu_utilization("mig", [0.5, 0.1], 4) == pytest.approx(0.35)
    assert progress_rates("mig", [0.5, 0.1], 4) == [0.5, 1.0]
    assert fits("time-slicing", [12 * GIB, 12 * GIB], 8 * GIB, 32 * GIB, 4)
    assert not fits("time-slicing", [12 * GIB, 12 * GIB], 12 * GIB, 32 * GIB, 4)
    assert not fits("mig", [], 30 * GIB, 80 * GIB, 4)


def test_pack_in_place_then_the_scheduler_fills_the_free_slices() -> None:
    c = cluster()
    first = c.submit(light())
    second = c.submit(light())
    assert (first.shared, second.shared) == (False, False)
    uuid = first.gpu_uuids[0]
    changed = ops.pack(c, uuid)
    assert changed["to"] == changed["from"] and changed["restart_gpu_s"] == 0.0
    assert first.shared and first.remaining_s == 3600.0  # it went on running
    third = c.submit(light())  # lands on the shared GPU's free slice, memory allowing
    assert third.shared and third.gpu_uuids == [uuid]
    node, gpu = c.find_gpu(uuid)
    assert gpu.tenants == [first.id, third.id]
    fourth = c.submit(light())  # 3 x 12 GiB does not fit a 32 GB V100: not a third tenant
    assert fourth.state == "queued"
    assert ops.pack(c, uuid) == {}  # already shared: no-op
    for _ in range(40):
        c.advance(15.0)
    assert gpu.utilization == pytest.approx(0.5, abs=0.07)
    expected = 3600.0 - 600.0 * (1 - TIME_SLICING_OVERHEAD)
    assert first.remaining_s == pytest.approx(expected, abs=15.0)
    report = c.state()
    assert report["counters"]["packed"] == 1  # type: ignore[index]


def test_pack_moves_a_job_onto_a_shared_gpu_and_charges_its_restart() -> None:
    c = cluster(PoolSpec("v", 2, 2, "V100", sharing="time-slicing", slices=4))
    a = c.submit(light())
    shared_uuid = a.gpu_uuids[0]
    ops.pack(c, shared_uuid)  # node-0's first GPU is shared now
    blocker = c.submit(light())
    assert blocker.shared and blocker.gpu_uuids == [shared_uuid]  # a free slice first
    c.submit(light())  # 3 x 12 GiB > 32 GB: node-0's second GPU, whole (best fit)
    mover = c.submit(light())
    assert mover.node == "node-1" and not mover.shared
    c.release(blocker)  # room on the shared GPU again
    for _ in range(40):
        c.advance(15.0)  # 10 minutes
    changed = ops.pack(c, mover.gpu_uuids[0])
    assert changed["from"] == "node-1" and changed["to"] == "node-0"
    # no checkpoint: its 10 minutes of work are lost, plus the 5-minute restart
    assert changed["restart_gpu_s"] == pytest.approx(900.0, abs=20.0)
    assert mover.shared and mover.remaining_s == pytest.approx(3600.0, abs=20.0)
    assert mover.restarting_until == c.time + 300.0  # relaunching on its slice first
    assert c.nodes["node-1"].idle()


def test_pack_refuses_what_cannot_share() -> None:
    c = cluster(PoolSpec("a", 1, 4, "A100"))
    whole = c.submit(light(shareable=False))
    with pytest.raises(Conflict, match="not shareable"):
        ops.pack(c, whole.gpu_uuids[0])
    other = c.submit(light())
    with pytest.raises(Conflict, match="cannot share"):
        ops.pack(c, other.gpu_uuids[0])


def test_pack_moves_a_light_job_off_a_pool_that_cannot_share_once_a_slice_is_free() -> None:
    # an analysis job that fell back onto a whole GPU of a pool that cannot share (a rented
    # H100) kept it, and its machine, powered at 25 % for hours: nothing packed it
    c = cluster(
        PoolSpec("a", 1, 1, "A100"),
        PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4),
    )
    stray = c.submit(light())
    other = c.submit(light())
    assert stray.node == "node-0" and other.node == "node-1"  # both whole
    uuid = stray.gpu_uuids[0]
    # no shared GPU has a slice for it yet: not offered to the pack policy, so the downclock
    # policy caps it meanwhile (offered to pack, it would stay whole at full clocks, pack
    # answering left_whole every 30 minutes, with nothing that could take it)
    assert uuid not in {u for _n, u, _k in c.fleet_reading().sharing}
    changed = ops.pack(c, uuid)  # asked anyway (a stale plan): left whole, for a later pack
    assert changed["to"] is None and "pool a cannot share" in str(changed["left_whole"])
    assert stray.node == "node-0" and not stray.shared
    ops.pack(c, other.gpu_uuids[0])  # node-1's GPU shared in place: free slices
    assert ("node-0", uuid, 0) in c.fleet_reading().sharing  # offered to the pack policy now
    stray.moved_at = c.time  # as if a consolidation had just moved it: pack leaves it a while
    assert uuid not in {u for _n, u, _k in c.fleet_reading().sharing}
    stray.moved_at = None
    changed = ops.pack(c, uuid)
    assert changed["from"] == "node-0" and changed["to"] == "node-1"
    assert stray.shared and c.nodes["node-0"].idle()


@pytest.mark.parametrize(
    ("pool", "reserved", "memory_gib"),
    [
        # its only pool that shares is all reserved by another project and lends no slices
        (PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4), {"owner": 1}, 12.0),
        # its only pool that shares has slices too small for it (80 GB / 7 = 11.4 GiB)
        (PoolSpec("h", 1, 1, "H100", sharing="mig", slices=7), {}, 20.0),
    ],
)
def test_a_light_job_no_sharing_pool_would_take_stays_out_of_the_pack_series(
    pool: PoolSpec, reserved: dict[str, int], memory_gib: float
) -> None:
    # in the series, such a GPU was neither packed (pack could never move its job) nor
    # capped (downclock skips the series), and pack was asked every 30 minutes
    c = cluster(pool, PoolSpec("a", 1, 1, "A100"), reserved=reserved)
    c.submit(light("owner", memory_gib=5))  # node-0 held: the next job falls back to the A100
    job = c.submit(light("guest", memory_gib=memory_gib))
    assert c.nodes[job.node].pool == "a"  # type: ignore[index]
    assert job.gpu_uuids[0] not in {u for _n, u, _k in c.fleet_reading().sharing}
    with pytest.raises(Conflict, match="cannot share"):
        ops.pack(c, job.gpu_uuids[0])


def test_pack_in_place_refuses_a_job_too_big_for_one_slice() -> None:
    c = cluster(PoolSpec("a", 1, 1, "A100", sharing="mig", slices=7))
    big = c.submit(light(memory_gib=60))  # a 1g slice of an 80 GB A100 holds 80/7 = 11.4 GiB
    uuid = big.gpu_uuids[0]
    with pytest.raises(Conflict, match=r"needs 60.0 GiB .* does not fit one mig slice"):
        ops.pack(c, uuid)
    assert not big.shared and c.find_gpu(uuid)[1].job == big.id  # left whole
    # so it is not offered to the pack policy (which repeats: a refusal every 30 minutes)
    assert uuid not in {u for _node, u, _n in c.fleet_reading().sharing}
    second = c.submit(light())
    assert second.state == "queued"  # nothing shares the GPU it holds


def test_pack_keeps_a_borrowed_job_off_the_owners_slices() -> None:
    c = cluster(PoolSpec("v", 2, 1, "V100", sharing="time-slicing", slices=4), reserved={"o": 2})
    owner = c.submit(light("o"))
    ops.pack(c, owner.gpu_uuids[0])  # node-0's GPU is shared, with free slices
    ops.lend(c, "v")
    guest = c.submit(light("guest"))
    assert guest.node == "node-1" and guest.borrowed  # on the owner's idle reserved GPU
    ops.unlend(c, "v")
    with pytest.raises(Conflict, match="its quota does not cover"):
        ops.pack(c, guest.gpu_uuids[0])  # neither onto node-0's slices nor shared in place
    assert guest.node == "node-1" and not guest.shared and guest.borrowed
    assert c.find_gpu(owner.gpu_uuids[0])[1].tenants == [owner.id]


def test_the_borrowed_series_names_the_gpus_of_borrowed_jobs() -> None:
    """pack-underused-gpus skips a GPU with gpuops_gpu_borrowed == 1, so it never asks the
    fleet for the pack it refuses (409); the GPU is out of the sharing series, so
    downclock-underused-gpus acts on it as on any GPU pack cannot share."""
    c = cluster(PoolSpec("v", 2, 1, "V100", sharing="time-slicing", slices=4), reserved={"o": 2})
    own = c.submit(light("o"))
    ops.lend(c, "v")
    guest = c.submit(light("guest"))
    assert guest.borrowed and not guest.shared
    reading = c.fleet_reading()
    assert reading.borrowed == (("node-1", guest.gpu_uuids[0]),)
    sharing = {uuid for _node, uuid, _n in reading.sharing}
    assert own.gpu_uuids[0] in sharing and guest.gpu_uuids[0] not in sharing
    with pytest.raises(Conflict, match="its quota does not cover"):
        ops.pack(c, guest.gpu_uuids[0])


def lent(
    *pools: PoolSpec,
    reserved: dict[str, tuple[str, int]],
    slice_borrowing: bool = True,
    min_runtime_s: float = 0.0,
    borrowing: bool = False,
    classes: tuple[PriorityClass, ...] = CLASSES,
) -> Cluster:
    """A cluster whose projects reserve ``reserved[project] = (pool, GPUs)`` and whose shared
    GPUs' free slices other projects may borrow (``slice_borrowing``)."""
    return Cluster(
        FleetConfig(
            pools=pools,
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=classes,
            reservations=tuple(ProjectSpec(p, (r,)) for p, r in reserved.items()),
            scheduler=SchedulerSettings(
                borrowing=borrowing, slice_borrowing=slice_borrowing,
                min_runtime_s=min_runtime_s, restart_s=300.0,
            ),
        )
    )  # fmt: skip


def test_a_shareable_job_takes_a_free_slice_in_any_of_its_pools_before_a_whole_gpu() -> None:
    c = cluster(
        PoolSpec("t", 1, 1, "T4", sharing="time-slicing", slices=4),
        PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4),
    )
    first = c.submit(light())
    assert first.pool == "t" and first.node == "node-0"  # its preferred pool
    second = c.submit(light())
    assert second.node == "node-1" and not second.shared
    ops.pack(c, second.gpu_uuids[0])  # the V100 is shared now, with room for another
    c.release(first)  # the T4 is free, whole
    third = c.submit(light())
    assert third.shared and third.gpu_uuids == second.gpu_uuids  # the V100's slice
    assert c.nodes["node-0"].idle()  # the T4 stays free (for a job that needs it whole)


@pytest.mark.parametrize("slice_borrowing", [True, False])
def test_another_projects_job_borrows_free_slices_only_where_the_fleet_lends_them(
    slice_borrowing: bool,
) -> None:
    c = lent(SLICED, reserved={"o": ("v", 2)}, slice_borrowing=slice_borrowing)
    owner = c.submit(light("o"))
    ops.pack(c, owner.gpu_uuids[0])
    guest = c.submit(light("guest"))
    if not slice_borrowing:  # neither a slice nor the idle reserved GPU: it waits
        assert guest.state == "queued" and not guest.borrowed
        return
    assert guest.shared and guest.borrowed and guest.gpu_uuids == owner.gpu_uuids
    whole = c.submit(light("guest", shareable=False))  # whole GPUs are lent by `lend` only
    assert whole.state == "queued"
    reading = c.fleet_reading()
    assert reading.borrowed == (("node-0", owner.gpu_uuids[0]),)


def test_the_owner_reclaims_a_gpu_whose_tenants_all_borrow_it() -> None:
    c = lent(SLICED, reserved={"o": ("v", 2)})
    first = c.submit(light("o"))
    ops.pack(c, first.gpu_uuids[0])
    guest = c.submit(light("guest"))
    assert guest.borrowed and guest.gpu_uuids == first.gpu_uuids
    c.release(first)  # the borrower is the GPU's last tenant
    for _ in range(4):
        c.advance(15.0)
    big = c.submit(JobSpec("training", 2, "o", pool="", duration_s=3600.0,
                           priority_class="routine"))  # fmt: skip
    assert big.state == "running" and sorted(big.gpu_uuids) == sorted(
        g.uuid for g in c.nodes["node-0"].gpus
    )
    assert guest.state == "queued" and guest.preemptions == 1 and not guest.borrowed
    assert c.scheduler.preemptions == {"guest": 1}


def test_a_gpu_shared_with_the_owners_own_job_is_not_freed_for_it() -> None:
    c = lent(SLICED, reserved={"o": ("v", 2)})
    own = c.submit(light("o"))
    ops.pack(c, own.gpu_uuids[0])
    guest = c.submit(light("guest"))
    big = c.submit(JobSpec("training", 2, "o", pool="", duration_s=3600.0,
                           priority_class="routine"))  # fmt: skip
    # preempting the borrower would not free the GPU its own job shares: nobody goes
    assert big.state == "queued" and guest.state == "running" and guest.preemptions == 0


def test_a_borrowed_slice_runs_its_minimum_runtime_before_its_owner_takes_it_back() -> None:
    c = lent(SLICED, reserved={"o": ("v", 2)}, min_runtime_s=600.0)
    first = c.submit(light("o"))
    ops.pack(c, first.gpu_uuids[0])
    guest = c.submit(light("guest"))
    c.release(first)
    big = c.submit(JobSpec("training", 2, "o", pool="", duration_s=3600.0,
                           priority_class="routine"))  # fmt: skip
    assert big.state == "queued" and guest.state == "running"
    for _ in range(41):  # past its 10 minutes; each step schedules
        c.advance(15.0)
    assert big.state == "running" and guest.state == "queued" and guest.preemptions == 1


def test_the_owner_takes_a_slice_back_from_a_borrower_for_its_own_light_job() -> None:
    c = lent(PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4),
             reserved={"o": ("v", 1)})  # fmt: skip
    own = c.submit(light("o"))
    ops.pack(c, own.gpu_uuids[0])
    guest = c.submit(light("guest"))  # 2 x 12 GiB on the 32 GB V100
    assert guest.borrowed and guest.gpu_uuids == own.gpu_uuids
    second = c.submit(light("o"))  # a third 12 GiB does not fit: the owner reclaims a slice
    assert second.shared and second.gpu_uuids == own.gpu_uuids and not second.borrowed
    assert guest.state == "queued" and guest.preemptions == 1
    assert c.find_gpu(own.gpu_uuids[0])[1].tenants == [own.id, second.id]


@pytest.mark.parametrize("power_up", [True, False])
def test_the_owner_waits_for_a_machine_powering_up_before_it_takes_a_slice_back(
    power_up: bool,
) -> None:
    c = lent(PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4, max_nodes=2,
                      boot_s=300.0), reserved={"o": ("v", 2)})  # fmt: skip
    own = c.submit(light("o"))
    ops.pack(c, own.gpu_uuids[0])
    guest = c.submit(light("guest"))
    second = c.submit(light("o"))  # no room on the shared GPU; the pool may power one up
    assert second.state == "queued" and guest.state == "running"
    if power_up:
        ops.scale_out(c, "v", 1)  # what power-up-on-queue does
        for _ in range(21):  # its five-minute boot: the owner's job waits, nobody is stopped
            c.advance(15.0)
        assert second.state == "running" and second.node != own.node
        assert guest.state == "running" and guest.preemptions == 0
        return
    for _ in range(39):  # nothing powers up: it waits two boot times, then reclaims
        c.advance(15.0)
    assert second.state == "queued" and guest.preemptions == 0
    for _ in range(2):
        c.advance(15.0)
    assert second.shared and second.gpu_uuids == own.gpu_uuids
    assert guest.state == "queued" and guest.preemptions == 1


def test_a_job_preempted_long_after_its_submit_waits_afresh_for_a_machine() -> None:
    """Its two boot times count from its requeue, not from its submit: an analysis job
    preempted off an H100 hours after its submit would take V100 slices back from two
    services at once, which would then power up a T4 node."""
    classes = (
        PriorityClass("routine", 50, models=("H100", "V100")),
        PriorityClass("high", 90, preempts=True),
    )
    c = lent(PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4, max_nodes=2,
                      boot_s=300.0), PoolSpec("h", 1, 1, "H100"),
             reserved={"o": ("v", 2)}, classes=classes)  # fmt: skip
    mine = c.submit(light("o"))
    own = c.submit(light("o"))
    assert c.node(mine.node).pool == "h" and c.node(own.node).pool == "v"
    ops.pack(c, own.gpu_uuids[0])
    guest = c.submit(light("guest"))  # borrows the slice of its GPU the owner leaves free
    assert guest.borrowed and guest.gpu_uuids == own.gpu_uuids
    for _ in range(60):  # a quarter of an hour (at the H100's speed it must not end first)
        c.advance(15.0)
    c.submit(JobSpec("training", 1, "p", pool="h", duration_s=3600.0, priority_class="high"))
    assert mine.state == "queued" and mine.preemptions == 1
    for _ in range(39):  # under two boot times since its requeue: it waits, nobody is stopped
        c.advance(15.0)
    assert mine.state == "queued" and guest.preemptions == 0
    for _ in range(2):
        c.advance(15.0)
    assert mine.gpu_uuids == own.gpu_uuids and guest.preemptions == 1


@pytest.mark.parametrize("waited", [0, 32])
def test_time_held_is_no_wait_for_a_slice(waited: int) -> None:
    """Time held is no wait for GPUs: once released, the owner's held job takes a lent slice
    back only when its two boot times are up, counted without the hold. One held from its
    submit waits them all after the release; one that waited eight minutes before a hold
    keeps those (the hold does not start its wait afresh)."""
    classes = (*CLASSES, PriorityClass("batch", 50, holdable=True))
    c = lent(PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4, max_nodes=2,
                      boot_s=300.0), reserved={"o": ("v", 2)}, classes=classes)  # fmt: skip
    own = c.submit(light("o"))
    ops.pack(c, own.gpu_uuids[0])
    guest = c.submit(light("guest"))
    nightly = c.submit(light("o", priority_class="batch"))
    assert guest.borrowed and nightly.state == "queued"  # it waits for a machine
    for _ in range(waited):  # steps of 15 s
        c.advance(15.0)
    ops.hold_class(c, "batch")
    for _ in range(120):  # half an hour held: six boot times
        c.advance(15.0)
    ops.release_class(c, "batch")
    left = 40 - waited  # two boot times are 40 steps
    for _ in range(left - 1):
        c.advance(15.0)
    assert nightly.state == "queued" and guest.preemptions == 0
    for _ in range(2):
        c.advance(15.0)
    assert nightly.gpu_uuids == own.gpu_uuids and guest.preemptions == 1


def test_a_light_job_waiting_for_power_frees_no_gpu_of_its_borrowers_either() -> None:
    """While it waits for a machine, the owner's light job does not take the whole-GPU path
    instead: preempting every borrowed tenant of a GPU to run there whole."""
    c = lent(PoolSpec("t", 1, 2, "T4", sharing="time-slicing", slices=4, max_nodes=3,
                      boot_s=600.0), reserved={"o": ("t", 2)}, borrowing=True)  # fmt: skip
    c.submit(light("o", shareable=False))
    first = c.submit(light("g", memory_gib=4))  # borrows the other GPU whole
    ops.pack(c, first.gpu_uuids[0])
    guests = [first] + [c.submit(light("g", memory_gib=4)) for _ in range(3)]
    for _ in range(60):
        c.advance(15.0)
    lent_gpu = first.gpu_uuids
    assert all(g.borrowed and g.gpu_uuids == lent_gpu for g in guests)
    mine = c.submit(light("o", memory_gib=4))
    assert mine.state == "queued" and all(g.preemptions == 0 for g in guests)
    for _ in range(80):  # two boot times, nothing powered up: it takes one slice back
        c.advance(15.0)
    assert mine.shared and mine.gpu_uuids == lent_gpu
    assert sum(g.preemptions for g in guests) == 1


def test_taking_a_slice_back_stops_only_the_borrowers_it_needs() -> None:
    c = lent(PoolSpec("t", 1, 2, "T4", sharing="time-slicing", slices=4),
             reserved={"o": ("t", 2)})  # fmt: skip
    c.submit(light("o", shareable=False))
    own = c.submit(light("o", memory_gib=4))
    ops.pack(c, own.gpu_uuids[0])
    big = c.submit(light("g", memory_gib=8))  # borrowed, runs longer: more work to lose
    for _ in range(20):
        c.advance(15.0)
    small = c.submit(light("g", memory_gib=2))
    c.advance(15.0)
    mine = c.submit(light("o", memory_gib=8))  # 4 + 8 + 2 + 8 > 16: one borrower must go
    assert mine.shared and mine.gpu_uuids == own.gpu_uuids
    # the cheaper small one alone would not make room; the big one alone does: it goes, and
    # the small one, preempted first on the way, is spared
    assert big.state == "queued" and small.state == "running" and small.preemptions == 0


def test_a_job_at_its_preemption_cap_borrows_no_slice() -> None:
    c = lent(SLICED, reserved={"o": ("v", 2)})
    own = c.submit(light("o"))
    ops.pack(c, own.gpu_uuids[0])
    capped = light("guest")
    job = c.scheduler.cluster._new_job(capped)
    job.preemptions = c.config.scheduler.max_preemptions  # as after three reclaims
    c.jobs[job.id] = job
    c.queues[job.pool].append(job.id)
    c.schedule()
    assert job.state == "queued"  # its owner could never take the slice back
    fresh = c.submit(light("guest"))
    assert fresh.borrowed and fresh.gpu_uuids == own.gpu_uuids  # one under the cap does


def test_reclaim_preempts_only_what_frees_the_gpus_it_needs() -> None:
    """A borrower on slices of two GPUs frees both; a cheaper borrower held whole beside it
    is not preempted for nothing (it would start again on the GPU left free)."""
    c = lent(PoolSpec("v", 1, 3, "V100", sharing="time-slicing", slices=4),
             reserved={"o": ("v", 3)}, borrowing=True)  # fmt: skip
    first, second = c.submit(light("o")), c.submit(light("o"))
    ops.pack(c, first.gpu_uuids[0])
    ops.pack(c, second.gpu_uuids[0])
    wide = c.submit(light("guest", gpus=2))
    assert wide.borrowed and sorted(wide.gpu_uuids) == sorted(first.gpu_uuids + second.gpu_uuids)
    c.release(first)
    c.release(second)
    for _ in range(40):
        c.advance(15.0)  # ten minutes of work the wide one would lose
    whole = c.submit(light("guest", shareable=False))
    assert whole.borrowed and not whole.shared
    c.advance(15.0)
    big = c.submit(JobSpec("training", 2, "o", pool="", duration_s=3600.0,
                           priority_class="routine"))  # fmt: skip
    assert big.state == "running" and wide.state == "queued" and wide.preemptions == 1
    assert whole.state == "running" and whole.preemptions == 0


def test_a_tenant_preempted_gives_back_its_slice_of_quota_not_a_whole_gpu() -> None:
    classes = (
        PriorityClass("steady", 40, preemptible=False),
        PriorityClass("low", 10),
        PriorityClass("urgent", 100, preempts=True, preemptible=False),
    )
    c = lent(PoolSpec("v", 1, 4, "V100", sharing="time-slicing", slices=4),
             reserved={"q": ("v", 1), "o": ("v", 3)}, slice_borrowing=False,
             classes=classes)  # fmt: skip
    u = [g.uuid for g in c.nodes["node-0"].gpus]
    c.submit(light("o", shareable=False, priority_class="steady", node="node-0",
                   gpu_uuids=(u[3],)))  # fmt: skip
    c.submit(light("q", priority_class="steady", node="node-0", gpu_uuids=(u[2],)))
    ops.pack(c, u[2])
    wide = c.submit(light("q", gpus=2, priority_class="low", node="node-0",
                          gpu_uuids=(u[0], u[1])))  # fmt: skip
    ops.pack(c, u[0])  # q counts 0.25 + 0.5 of its quota of 1
    waiting = c.submit(light("q", shareable=False, priority_class="low"))
    assert waiting.state == "queued"
    c.submit(JobSpec("training", 1, "o", pool="", duration_s=3600.0, priority_class="urgent"))
    assert wide.state == "queued" and wide.preemptions == 1  # its 0.5 is back, not 2 GPUs
    assert waiting.state == "queued"  # 0.25 + 1 is beyond q's quota, and nothing is unreserved
    guaranteed, _shared = c.scheduler._usage()
    assert guaranteed[("q", "v")] <= c.scheduler.quota("q", "v")


def test_pack_moves_a_light_job_onto_another_projects_free_slice_as_borrowed() -> None:
    c = lent(
        PoolSpec("t", 1, 1, "T4", sharing="time-slicing", slices=4),
        PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4),
        reserved={"serving": ("t", 1), "o": ("v", 1)},
    )
    service = c.submit(light("serving", memory_gib=9.3))
    assert service.pool == "t" and not service.shared
    owner = c.submit(light("o", memory_gib=9.3))  # the T4 is taken: the V100
    # no shared GPU yet, and shared in place the T4 would take nobody (two 9.3 GiB jobs do
    # not fit its 16 GB): left whole, so that a later pack can still move it
    left = ops.pack(c, service.gpu_uuids[0])
    assert left["to"] is None and "16 GiB T4" in str(left["left_whole"])
    assert not service.shared and c.find_gpu(service.gpu_uuids[0])[1].job == service.id
    ops.pack(c, owner.gpu_uuids[0])
    changed = ops.pack(c, service.gpu_uuids[0])
    assert changed["to"] == owner.node and service.gpu_uuids == owner.gpu_uuids
    assert service.borrowed and c.nodes["node-0"].idle()
    assert c.fleet_reading().borrowed == ((owner.node, owner.gpu_uuids[0]),)


def test_lending_lets_waiting_jobs_borrow_idle_reserved_gpus_until_the_owner_needs_them() -> None:
    c = cluster(PoolSpec("v", 1, 2, "V100"), reserved={"owner": 2})
    guest = c.submit(light("guest", shareable=False))
    assert guest.state == "queued"
    assert c.scheduler.borrow_demand() == {"v": 1}
    assert ops.lend(c, "v") == {"pool": "v", "lending": True}
    assert guest.state == "running" and guest.borrowed
    assert ops.lend(c, "v") == {}
    assert c.scheduler.borrow_demand() == {"v": 0}
    assert ops.unlend(c, "v") == {"pool": "v", "lending": False}
    assert guest.state == "running"  # lending stopped: running borrowers go on
    c.submit(light("owner", shareable=False))
    owner = c.submit(light("owner", shareable=False))  # the owner needs both GPUs back
    assert owner.state == "running" and guest.state == "queued" and guest.preemptions == 1


def test_reclaim_requeues_the_job_with_its_restart_cost() -> None:
    c = cluster(PoolSpec("a", 1, 1, "A100"))
    idle = c.submit(light(shareable=False))
    c.advance(600.0)
    waiting = c.submit(light(shareable=False))
    changed = ops.reclaim(c, idle.gpu_uuids[0])
    assert changed["requeued"] is True
    assert waiting.state == "running" and idle.state == "queued"  # behind what waited
    assert idle.remaining_s == pytest.approx(3600.0)  # started over
    assert idle.relaunch_s == 300.0  # and relaunches first when it starts again
    assert idle.submitted_at == 0.0  # its completion time counts from the first submit
    assert c.reclaimed_gpu_s == pytest.approx(3000.0)  # what it had left, on 1 GPU
    assert changed["released_gpus"] == [waiting.gpu_uuids[0]] and changed["restarted_on"] == []


def test_reclaim_counts_nothing_when_the_job_starts_straight_again() -> None:
    c = cluster(PoolSpec("a", 1, 1, "A100"))
    job = c.submit(light(shareable=False))
    uuid = job.gpu_uuids[0]
    c.advance(600.0)
    changed = ops.reclaim(c, uuid)  # nothing else waits: the scheduler places it back
    assert job.state == "running" and job.gpu_uuids == [uuid]
    assert changed["released_gpus"] == [] and changed["restarted_on"] == [uuid]
    assert c.reclaimed_gpu_s == 0.0  # it holds the GPU as before
    assert job.remaining_s == pytest.approx(3600.0)  # its restart was paid: work lost,
    assert job.restarting_until == c.time + 300.0  # and the relaunch


def test_a_machine_powered_up_boots_before_it_runs_jobs() -> None:
    c = cluster()
    c.submit(light(shareable=False))
    c.submit(light(shareable=False))
    waiting = c.submit(light(shareable=False))
    assert c.scheduler.demand() == {"v": 1}
    added = ops.scale_out(c, "v", 1)["added"]
    node = c.nodes[added[0]]  # type: ignore[index]
    assert node.state == "booting" and waiting.state == "queued"
    assert c.scheduler.demand() == {"v": 0}  # the booting node will take it: no second one
    c.advance(240.0)
    assert waiting.state == "queued" and node.gpus[0].power > 0  # idle power while booting
    c.advance(60.0)
    assert node.state == "up" and waiting.node == node.name
