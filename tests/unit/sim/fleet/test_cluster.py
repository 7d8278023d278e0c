"""The cluster without threads or sockets: workload, scheduler, queue, profiles, operations."""

from __future__ import annotations

import random

import pytest

from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet.errors import BadRequest, Conflict, NotFound
from gpuops.sim.fleet.model import profile_utilization


def quiet(**kwargs: object) -> FleetConfig:
    return FleetConfig(arrival_rate_per_min=0.0, **kwargs)  # type: ignore[arg-type]


def gpus_by_job(cluster: Cluster) -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for node in cluster.nodes.values():
        for gpu in node.gpus:
            out.setdefault(gpu.job, []).append(gpu.uuid)
    return out


def test_default_workload_is_mostly_busy_with_one_idle_and_one_light_gpu() -> None:
    cluster = Cluster(FleetConfig())
    cluster.advance(1.0)
    state = cluster.state()
    gpus = [g for n in state["nodes"] for g in n["gpus"]]  # type: ignore[attr-defined]
    assert len(gpus) == 16
    profiles = {j["id"]: j["profile"] for j in state["jobs"]}  # type: ignore[attr-defined]
    by_profile = [profiles.get(g["job"]) for g in gpus]
    assert by_profile.count("training") >= 10
    assert by_profile.count("notebook") >= 1
    assert by_profile.count("light") >= 1
    assert state["queue"] == {"default": 0}
    for g in gpus:
        if profiles.get(g["job"]) == "notebook":
            assert g["utilization"] < 0.05
        if profiles.get(g["job"]) == "light":
            assert 0.15 < g["utilization"] < 0.35
        if profiles.get(g["job"]) == "training":
            assert g["utilization"] > 0.8


def test_same_seed_same_fleet() -> None:
    a, b = Cluster(FleetConfig(seed=7)), Cluster(FleetConfig(seed=7))
    for c in (a, b):
        for _ in range(100):
            c.advance(5.0)
    assert a.state() == b.state()
    assert Cluster(FleetConfig(seed=8)).state()["nodes"] != a.state()["nodes"]


def test_uuids_are_unique_and_nvml_shaped() -> None:
    cluster = Cluster(FleetConfig())
    uuids = [g.uuid for n in cluster.nodes.values() for g in n.gpus]
    assert len(set(uuids)) == len(uuids)
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)


@pytest.mark.parametrize(
    ("profile", "low", "high"),
    [("training", 0.85, 0.95), ("notebook", 0.0, 0.04), ("light", 0.2, 0.3), ("inference", 0, 1)],
)
def test_profile_utilization_ranges(profile: str, low: float, high: float) -> None:
    rng = random.Random(1)
    values = [profile_utilization(profile, t, 0.3, rng) for t in range(0, 600, 3)]
    assert all(low <= v <= high for v in values)
    if profile == "inference":  # bursty: both quiet and busy phases
        assert min(values) < 0.2 and max(values) > 0.7


def test_queue_grows_when_arrivals_outpace_free_gpus_and_drains_when_jobs_end() -> None:
    cluster = Cluster(quiet(initial_jobs=()))
    for _ in range(20):
        cluster.submit(JobSpec("training", 4, "p", duration_s=60))
    assert cluster.state()["queue"] == {"default": 16}
    cluster.advance(61)
    assert cluster.state()["queue"] == {"default": 12}
    for _ in range(3):
        cluster.advance(61)
    assert cluster.state()["queue"] == {"default": 0}


def test_background_arrivals_are_poisson_and_finish() -> None:
    cluster = Cluster(FleetConfig(arrival_rate_per_min=60.0, initial_jobs=()))
    for _ in range(60):
        cluster.advance(1.0)
    submitted = cluster._job_seq
    assert 30 < submitted < 100
    cluster.set_arrival_rate(0.0)
    for _ in range(1000):
        cluster.advance(10.0)
    assert cluster.jobs == {}


def test_scheduler_priority_then_age_and_backfill() -> None:
    cluster = Cluster(quiet(pools=(PoolSpec(nodes=1, gpus_per_node=4),), initial_jobs=()))
    first = cluster.submit(JobSpec("training", 3, "a", duration_s=10))
    big = cluster.submit(JobSpec("training", 4, "b", duration_s=10))
    small = cluster.submit(JobSpec("light", 1, "c", duration_s=10))
    urgent = cluster.submit(JobSpec("training", 4, "d", duration_s=10, priority=5))
    assert first.state == "running"
    assert small.state == "running"  # backfilled past the 4-GPU job
    assert big.state == urgent.state == "queued"
    cluster.advance(11)
    assert urgent.state == "running" and big.state == "queued"


def test_submit_rejects_bad_specs() -> None:
    cluster = Cluster(quiet())
    with pytest.raises(BadRequest, match="profile 'gaming' is unknown"):
        cluster.submit(JobSpec("gaming"))
    with pytest.raises(BadRequest, match="exceeds the 4 GPUs per node"):
        cluster.submit(JobSpec(gpus=5))
    with pytest.raises(NotFound, match="no pool named 'gpu-xl'"):
        cluster.submit(JobSpec(pool="gpu-xl"))
    with pytest.raises(Conflict, match="node node-0 has 0 free GPUs"):
        cluster.submit(JobSpec(node="node-0"))


def test_reclaim_frees_every_gpu_of_the_job() -> None:
    cluster = Cluster(quiet())
    uuid = cluster.nodes["node-0"].gpus[0].uuid
    changed = ops.reclaim(cluster, uuid)
    assert changed["job"] == "job-1" and len(changed["released_gpus"]) == 4  # type: ignore[arg-type]
    assert all(g.job is None for g in cluster.nodes["node-0"].gpus)
    assert ops.reclaim(cluster, uuid) == {}
    assert cluster.counters["reclaimed"] == 1


def test_clock_lock_caps_the_graphics_clock() -> None:
    cluster = Cluster(quiet())
    gpu = cluster.nodes["node-0"].gpus[0]
    assert gpu.graphics_clock_mhz() > 1100
    ops.lock_clocks(cluster, gpu.uuid, 1100)
    assert gpu.graphics_clock_mhz() <= 1100
    with pytest.raises(BadRequest, match="outside the supported range 210-1410 MHz"):
        ops.lock_clocks(cluster, gpu.uuid, 5000)
    assert ops.reset_clocks(cluster, gpu.uuid)["previous"] == 1100
    assert ops.reset_clocks(cluster, gpu.uuid) == {}


def test_migrate_moves_jobs_to_free_gpus_or_back_to_the_queue() -> None:
    cluster = Cluster(quiet())
    changed = ops.migrate(cluster, "node-3")
    moved = {m["job"] for m in changed["moved"]}  # type: ignore[attr-defined]
    requeued = set(changed["requeued"])  # type: ignore[call-overload]
    assert moved | requeued == {"job-4", "job-5", "job-6"}
    assert cluster.nodes["node-3"].state == "drained"
    assert all(g.job is None for g in cluster.nodes["node-3"].gpus)
    assert cluster.state()["queue"] == {"default": len(requeued)}
    assert changed["drained"] is True
    assert sum(cluster.restarts.values()) == 3  # each job stopped restarts (no work: no duration)
    # drained already: not this call's drain to give back
    assert ops.migrate(cluster, "node-3") == {
        "node": "node-3",
        "drained": False,
        "state": "drained",
    }
    # room elsewhere: the next migration moves instead of requeueing
    ops.restore(cluster, "node-3")
    ops.reclaim(cluster, cluster.nodes["node-0"].gpus[0].uuid)
    changed = ops.migrate(cluster, "node-1")
    assert changed["moved"] == [{"job": "job-2", "from": "node-1", "to": "node-0"}]


def test_scale_out_places_queued_jobs_and_scale_in_removes_idle_nodes() -> None:
    cluster = Cluster(quiet())
    ops.burst(cluster, "default", 3, 4, 30.0)
    assert cluster.state()["queue"] == {"default": 3}
    assert ops.scale_out(cluster, "default", 2) == {
        "pool": "default",
        "added": ["node-4", "node-5"],
    }
    assert cluster.state()["queue"] == {"default": 1}
    assert ops.scale_in(cluster, "default", 5) == {}  # every node holds a job
    cluster.advance(31)
    assert ops.scale_in(cluster, "default", 1) == {"pool": "default", "removed": ["node-5"]}
    assert cluster.counters["nodes_added"] == 2


def test_fail_stalls_jobs_and_restore_resumes() -> None:
    cluster = Cluster(quiet(initial_jobs=(JobSpec("training", 4, "p", duration_s=10),)))
    ops.fail(cluster, "node-0")
    cluster.advance(20)
    assert cluster.jobs["job-1"].state == "running"
    assert cluster.fleet_reading().nodes[("default", "failed")] == 1
    ops.restore(cluster, "node-0")
    cluster.advance(11)
    assert cluster.jobs == {}
