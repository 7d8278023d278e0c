"""Culling idle notebooks, the shareable label of the sharing series, and where a run's powered
GPU-hours that do no work go."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuops.sim.fleet import Cluster, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.config import SchedulerSettings
from gpuops.sim.fleet.report import Recorder, table
from gpuops.sim.fleet.virtual import VirtualFleet
from gpuops.sim.fleet.workload import PriorityClass

CLASSES = (PriorityClass("interactive", 60), PriorityClass("routine", 50))
ONE_A100 = PoolSpec("a", 1, 1, "A100")


def config(*pools: PoolSpec) -> FleetConfig:
    return FleetConfig(
        pools=pools or (ONE_A100,),
        arrival_rate_per_min=0.0,
        initial_jobs=(),
        priority_classes=CLASSES,
        scheduler=SchedulerSettings(borrowing=False, min_runtime_s=0.0, restart_s=300.0),
    )


def notebook(**kw: object) -> JobSpec:
    kw.setdefault("pool", "")
    return JobSpec(
        "notebook", 1, "p", duration_s=4 * 3600.0, priority_class="interactive",
        job_class="notebooks", **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_reclaiming_an_idle_notebook_culls_its_session() -> None:
    """Requeued, the notebook would take its GPU straight back (nothing else waits) and hold
    it at ~2 % again; culled, its session ends and the GPU is free."""
    c = Cluster(config())
    job = c.submit(notebook())
    uuid = job.gpu_uuids[0]
    c.advance(1200.0)
    changed = ops.reclaim(c, uuid)
    assert changed["requeued"] is False and changed["released_gpus"] == [uuid]
    assert job.id not in c.jobs and not c.queues["a"]
    assert c.nodes["node-0"].free_gpus()[0].uuid == uuid
    assert c.counters["culled"] == 1
    # not a completed job; recorded apart as if its session ran to its end (its wait, 0,
    # plus 4 h), so culling does not shorten the completion times that count it; delivered
    # only the 20 minutes it held the GPU
    assert c.completed == []
    assert c.culled_sessions == [("interactive", "p", 0.0, 4 * 3600.0)]
    assert c.completed_gpu_s == pytest.approx(1200.0)
    assert c.reclaimed_gpu_s == pytest.approx(4 * 3600.0 - 1200.0)


def test_the_report_counts_culled_sessions_apart_from_completed_jobs() -> None:
    """A culled notebook is not a completed job: the report counts it apart, its JCT (its
    whole session) in the mean the target reads and out of the completed-jobs-only mean."""
    recorder = Recorder()
    fleet = VirtualFleet(config(PoolSpec("a", 1, 2, "A100")), 0, None, 30.0, recorder=recorder)
    c = fleet.cluster
    session = c.submit(notebook(pool="a"))
    c.submit(JobSpec("training", 1, "p", pool="a", duration_s=1800.0, priority_class="routine"))
    fleet.run_until(1200.0)
    ops.reclaim(c, session.gpu_uuids[0])
    fleet.run_until(3600.0)
    report = recorder.report(c)
    assert (report.jobs_completed, report.culled, report.jobs_submitted) == (1, 1, 2)
    assert report.jct_completed_mean_s == pytest.approx(1800.0, abs=30.0)
    assert report.jct_mean_s == pytest.approx((1800.0 + 4 * 3600.0) / 2, abs=30.0)
    assert report.classes["interactive"].completed == 0
    assert report.classes["interactive"].culled == 1
    assert report.projects["p"].completed == 1
    assert "(and 1 notebook sessions culled)" in table(report)


def test_reclaim_still_requeues_a_service_and_a_batch_job() -> None:
    c = Cluster(config())
    service = c.submit(
        JobSpec("inference", 1, "p", pool="", duration_s=3600.0, priority_class="routine")
    )
    c.advance(600.0)
    assert ops.reclaim(c, service.gpu_uuids[0])["requeued"] is True
    assert service.id in c.jobs and c.counters["culled"] == 0


def test_waste_breakdown_names_unallocated_idle_and_shared_gpu_hours() -> None:
    """One hour: a free A100 (unallocated), a notebook held whole at ~2 %, and two light jobs
    (12 GiB, ~25 %) sharing a 32 GiB V100 of 4 slices: its unused half is theirs, limited by
    memory (8 GiB left < 12)."""
    v100 = PoolSpec("v", 1, 1, "V100", sharing="time-slicing", slices=4)
    a100 = PoolSpec("a", 1, 2, "A100")
    recorder = Recorder()
    fleet = VirtualFleet(config(a100, v100), 0, None, scrape_interval_s=30.0, recorder=recorder)
    c = fleet.cluster
    c.submit(notebook(pool="a"))
    light = JobSpec(
        "light", 1, "q", pool="v", duration_s=7200.0, priority_class="routine",
        memory_gib=12, shareable=True, job_class="analysis",
    )  # fmt: skip
    first = c.submit(light)
    ops.pack(c, first.gpu_uuids[0])
    second = c.submit(light)
    assert second.gpu_uuids == first.gpu_uuids  # on the first one's free slice
    fleet.run_until(3600.0)
    report = recorder.report(c)
    w = report.waste
    assert w.unallocated == {"a": pytest.approx(1.0, abs=0.02)}
    assert w.unallocated_node == {"partly used": pytest.approx(1.0, abs=0.02)}  # the notebook's
    assert w.idle_whole["notebooks"] == pytest.approx(0.98, abs=0.02)
    assert w.idle_shared["analysis"] == pytest.approx(0.5, abs=0.05)
    assert w.shared_limit == {"memory": pytest.approx(0.5, abs=0.05)}
    assert w.class_allocated["analysis"] == pytest.approx(1.0, abs=0.02)
    powered_h = sum(p.powered_gpu_hours for p in report.pools.values())
    busy_h = powered_h * (report.utilization_powered or 0.0)
    assert w.total() == pytest.approx(powered_h - busy_h, abs=1e-6)
    assert "shared unused, limit: memory" in table(report)
    # the free A100 draws its idle 55 W for the hour; the held A100 and the shared V100 their
    # idle 55 + 40 W, and above it what their load draws (steady: the power they show now)
    e = report.energy_split_kwh
    assert e["free GPUs (idle draw)"] == pytest.approx(0.055, abs=0.002)
    assert e["held GPUs, idle draw"] == pytest.approx(0.055 + 0.040, abs=0.002)
    held = [g for n in c.nodes.values() for g in n.gpus if g.job or g.tenants]
    load_w = sum(g.power - g.model.idle_power_watts for g in held)
    assert load_w > 50.0  # the two light jobs' load on the V100
    assert e["held GPUs, load"] == pytest.approx(load_w / 1000.0, rel=0.05)
    assert sum(e.values()) == pytest.approx(report.energy_kwh, rel=0.02)


def test_the_sharing_series_leaves_out_gpus_held_by_jobs_that_cannot_share() -> None:
    """pack-underused-gpus reads gpuops_gpu_shared_jobs == 0: a GPU held whole by a job that
    is not shareable has no series, so the policy never asks the fleet to pack it (409)."""
    v100 = PoolSpec("v", 1, 3, "V100", sharing="time-slicing", slices=4)
    c = Cluster(config(v100))
    spec = JobSpec(
        "light", 1, "q", pool="v", duration_s=7200.0, priority_class="routine", memory_gib=12
    )
    fixed = c.submit(spec)
    light = c.submit(replace(spec, shareable=True))
    series = {uuid: n for _node, uuid, n in c.fleet_reading().sharing}
    assert fixed.gpu_uuids[0] not in series
    assert series[light.gpu_uuids[0]] == 0  # held whole, shareable: a candidate
    free = [g.uuid for g in c.nodes["node-0"].free_gpus()]
    assert [series[u] for u in free] == [0]
    ops.pack(c, light.gpu_uuids[0])
    assert c.fleet_reading().sharing.count(("node-0", light.gpu_uuids[0], 1)) == 1
