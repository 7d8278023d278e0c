"""Run reports: the figures of a virtual run measured on the cluster, and ``gpuops fleet run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sim.fleet import FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.report import Recorder, table
from gpuops.sim.fleet.virtual import VirtualFleet

DEMO = Path(__file__).parents[4] / "examples" / "fleets" / "demo.yaml"


def test_report_of_a_known_workload() -> None:
    config = FleetConfig(arrival_rate_per_min=0.0)  # 16 GPUs, 15 allocated, no arrivals
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    short = fleet.cluster.submit(JobSpec("training", 1, "p", duration_s=600))
    assert short.state == "running"  # takes the 16th GPU for 10 minutes
    fleet.run_until(3600.0)
    report = recorder.report(fleet.cluster)
    assert report.hours == pytest.approx(1.0)
    assert report.gpus_mean == 16
    assert report.allocation_ratio == pytest.approx((15 * 3600 + 600) / (16 * 3600))
    assert report.utilization_powered == pytest.approx(
        report.utilization_allocated * report.allocation_ratio  # type: ignore[operator]
    )
    assert report.jobs_completed == 1
    assert report.classes["-"].jct_mean_s == pytest.approx(600.0)
    assert report.classes["-"].wait_mean_s == 0.0
    assert report.energy_kwh > 16 * 55 / 1000  # at least every A100 idling for an hour
    assert "allocation ratio" in table(report)


def test_fleet_run_prints_a_json_report() -> None:
    result = CliRunner().invoke(
        cli,
        ["--log-level", "warning", "fleet", "run", "--fleet", str(DEMO), "--hours", "1", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["fleet"] == "demo"
    assert report["allocation_ratio"] == pytest.approx(15 / 16)


def test_utilization_counts_sharers_capped_booting_gpus_idle_and_rented_gpus() -> None:
    """Over powered GPUs: a shared GPU is as busy as its sharers together, at most 100 %; a
    machine booting is powered and idle; a rented cloud GPU counts while it is rented."""
    shared = PoolSpec("s", 2, 1, "RTXA6000", sharing="time-slicing", slices=4)
    cloud = PoolSpec("c", 0, 4, "H100", cloud=True, max_nodes=1, boot_s=180.0)
    config = FleetConfig(pools=(shared, cloud), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    c = fleet.cluster
    spec = JobSpec("training", 1, "p", pool="s", duration_s=7200.0, memory_gib=10, shareable=True)
    first, second = c.submit(spec), c.submit(spec)
    ops.pack(c, first.gpu_uuids[0])  # shared in place
    ops.pack(c, second.gpu_uuids[0])  # onto the first's GPU: two trainings ask 1.8 of it
    assert second.gpu_uuids == first.gpu_uuids
    rented = ops.scale_out(c, "c", 1)["added"]
    fleet.run_until(1800.0)
    report = recorder.report(c)
    # (1.0 + idle) / 2, but 0.9 for the 5 minutes the second relaunches (asking nothing of
    # the GPU); the first 30 s count the readings before the first step (0)
    busy = 0.9 * 300.0 + 1.0 * 1470.0
    assert report.pools["s"].utilization_powered == pytest.approx(busy / 3600, abs=0.01)
    assert report.pools["s"].utilization_allocated == pytest.approx(busy / 1770, abs=0.02)
    assert report.pools["c"].powered_gpu_hours == pytest.approx(4 * 0.5)
    assert report.pools["c"].utilization_powered == 0.0  # booting, then idle
    assert report.gpus_mean == pytest.approx(6.0)
    assert report.utilization_powered == pytest.approx(busy / 1800 / 6, abs=0.005)
    ops.scale_in(c, "c", 1, rented[0])  # given back: no longer counted
    fleet.run_until(3600.0)
    report = recorder.report(c)
    assert report.pools["c"].powered_gpu_hours == pytest.approx(4 * 0.5, abs=0.05)
    assert report.gpus_mean == pytest.approx(4.0, abs=0.05)


def test_energy_split_counts_hosts_and_sums_to_the_meter() -> None:
    """A node's host draws whenever it is on: an empty node costs its host's idle draw, a
    busy one idle plus load; the split adds up to the metered energy."""
    pool = PoolSpec("a", 2, 4, "A100", host_idle_watts=825.0, host_peak_watts=1650.0)
    config = FleetConfig(pools=(pool,), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    fleet.cluster.submit(JobSpec("training", 4, "p", pool="a", duration_s=7200.0))
    fleet.run_until(3600.0)
    split = recorder.report(fleet.cluster).energy_split_kwh
    assert split["hosts, idle draw"] == pytest.approx(2 * 0.825, rel=0.02)  # two hosts, 1 h
    assert 0.8 * 0.825 < split["hosts, load"] < 0.95 * 0.825  # one host at training's ~0.9
    report = recorder.report(fleet.cluster)
    assert sum(split.values()) == pytest.approx(report.energy_kwh, rel=0.02)


def test_fleet_run_is_the_whatifs_off_run() -> None:
    """`gpuops fleet run` steps and observes the cluster as the what-if's baseline does, so the
    fleet file's calibration and the what-if's off column are one figure (at 30 s steps they
    differed by up to 0.9 points of utilization)."""
    from gpuops.sim.fleet.fleetfile import load_fleet
    from gpuops.sim.whatif import run_off

    case_study = DEMO.parent / "case-study.yaml"
    args = ["fleet", "run", "--fleet", str(case_study), "--hours", "3", "--json"]
    result = CliRunner().invoke(cli, ["--log-level", "warning", *args])
    assert result.exit_code == 0, result.output
    cli_report = json.loads(result.output)
    off = run_off(load_fleet(case_study), 3.0).report
    assert cli_report["utilization_powered"] == off.utilization_powered
    assert cli_report["energy_kwh"] == off.energy_kwh
    assert cli_report["jobs_completed"] == off.jobs_completed


def test_the_bounds_count_the_fewest_gpus_the_running_jobs_need() -> None:
    """Utilization over the fewest GPUs the running jobs could hold: in their own pool whole
    nodes are powered; in any pool shareable jobs pack by memory, slices and load."""
    a100 = PoolSpec("a", 2, 4, "A100")
    rtx = PoolSpec("s", 1, 2, "RTXA6000", sharing="time-slicing", slices=4)
    config = FleetConfig(pools=(a100, rtx), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    c = fleet.cluster
    for _ in range(2):  # two 1-GPU trainings: one 4-GPU node would hold both
        c.submit(JobSpec("training", 1, "p", pool="a", duration_s=7200.0))
    light = JobSpec("light", 1, "p", pool="s", duration_s=7200.0, memory_gib=10, shareable=True)
    c.submit(light), c.submit(light)  # each on a whole GPU: one GPU would hold both
    fleet.run_until(1800.0)
    report = recorder.report(c)
    a, s = report.pools["a"], report.pools["s"]
    assert a.utilization_bound == pytest.approx(a.utilization_powered * 8 / 4)  # type: ignore[operator]
    assert s.utilization_bound == pytest.approx(s.utilization_powered)  # one node: 2 GPUs
    busy = report.utilization_powered * 10  # type: ignore[operator]
    assert report.utilization_bound_pools == pytest.approx(busy / 6)
    assert report.utilization_bound_any_pool == pytest.approx(busy / 3)  # 2 + 1 GPUs
    assert "at most, jobs in any pool" in table(report)


def test_the_any_pool_bound_packs_no_more_than_memory_allows() -> None:
    rtx = PoolSpec("s", 1, 2, "RTXA6000", sharing="time-slicing", slices=4)
    config = FleetConfig(pools=(rtx,), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    big = JobSpec("light", 1, "p", pool="s", duration_s=7200.0, memory_gib=30, shareable=True)
    fleet.cluster.submit(big), fleet.cluster.submit(big)  # 60 GiB: not on one 48 GB GPU
    fleet.run_until(1800.0)
    report = recorder.report(fleet.cluster)
    assert report.utilization_powered is not None and report.utilization_powered > 0.2
    assert report.utilization_bound_any_pool == pytest.approx(report.utilization_powered)


def test_jobs_over_half_a_gpu_need_a_gpu_each_in_the_bounds() -> None:
    """Three 9.3 GiB jobs on 16 GB T4s: their memory sums to under two GPUs, but no two fit
    one GPU, so they need three (two 2-GPU nodes in their pool)."""
    t4 = PoolSpec("t", 2, 2, "T4", sharing="time-slicing", slices=4)
    config = FleetConfig(pools=(t4,), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    spec = JobSpec("light", 1, "p", pool="t", duration_s=7200.0, memory_gib=9.3, shareable=True)
    for _ in range(3):
        fleet.cluster.submit(spec)
    fleet.run_until(1800.0)
    report = recorder.report(fleet.cluster)
    assert report.utilization_powered is not None and report.utilization_powered > 0.1
    assert report.utilization_bound_pools == pytest.approx(report.utilization_powered)
    assert report.utilization_bound_any_pool == pytest.approx(report.utilization_powered * 4 / 3)


def test_the_bounds_are_never_below_what_the_run_reached() -> None:
    """Over a case-study run, and a run with a GPU shared by pack (two light jobs on one) and a
    job whose memory exceeds its GPU: each bound at least the run's own utilization, overall and
    per pool, and the any-pool relaxation at least the in-pool one."""
    from gpuops.sim.fleet.fleetfile import load_fleet
    from gpuops.sim.whatif import run_off

    off = run_off(load_fleet(DEMO.parent / "case-study.yaml"), 3.0).report
    assert off.utilization_powered is not None
    assert off.utilization_bound_pools >= off.utilization_powered  # type: ignore[operator]
    assert off.utilization_bound_any_pool >= off.utilization_bound_pools  # type: ignore[operator]
    for pool in off.pools.values():  # None: no job ran there, nothing was needed
        if pool.utilization_bound is None:
            assert pool.utilization_powered == 0.0
        else:
            assert pool.utilization_bound >= pool.utilization_powered  # type: ignore[operator]

    rtx = PoolSpec("s", 3, 1, "RTXA6000", sharing="time-slicing", slices=4)
    config = FleetConfig(pools=(rtx,), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    c = fleet.cluster
    spec = JobSpec("light", 1, "p", pool="s", duration_s=7200.0, memory_gib=10, shareable=True)
    first, second = c.submit(spec), c.submit(spec)
    ops.pack(c, first.gpu_uuids[0])  # shared in place
    ops.pack(c, second.gpu_uuids[0])  # onto the first's GPU
    assert second.gpu_uuids == first.gpu_uuids
    huge = JobSpec("light", 1, "p", pool="s", duration_s=7200.0, memory_gib=150, shareable=True)
    assert c.submit(huge).state == "running"  # 150 GiB on a 48 GB GPU: one GPU
    fleet.run_until(1800.0)
    report = recorder.report(c)
    assert report.utilization_powered is not None and report.utilization_powered > 0.2
    assert report.utilization_bound_pools >= report.utilization_powered  # type: ignore[operator]
    assert report.utilization_bound_any_pool >= report.utilization_bound_pools  # type: ignore[operator]


def test_rental_cost_and_utilization_weighted_by_throughput() -> None:
    """A rented H100 node costs its price per powered GPU-hour on top of energy; a busy T4
    weighs 65/989 of a busy H100 in the weighted utilization."""
    t4 = PoolSpec("t4", 1, 1, "T4")
    cloud = PoolSpec("c", 1, 1, "H100", cloud=True, price_per_gpu_hour=12.0)
    config = FleetConfig(pools=(t4, cloud), arrival_rate_per_min=0.0, initial_jobs=())
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    fleet.cluster.submit(JobSpec("training", 1, "p", pool="t4", duration_s=7200))
    fleet.run_until(3600.0)
    report = recorder.report(fleet.cluster)
    assert report.rental_cost == pytest.approx(12.0)  # one H100 powered for the hour
    assert report.total_cost == pytest.approx(report.energy_cost + 12.0)
    busy = report.pools["t4"].utilization_powered
    assert busy is not None and busy > 0.8
    assert report.utilization_powered == pytest.approx(busy / 2, rel=0.01)
    assert report.utilization_weighted == pytest.approx(busy * 65 / (65 + 989), rel=0.01)
    assert "rental 12.00" in table(report)


def test_sessions_slowed_by_a_clock_lock_report_slowdown_and_time_over_objective() -> None:
    """A service on a GPU locked to a third of its clock answers slower (sessions run for
    wall-clock time: they do not take longer, they answer slower), all of its time over an
    objective of 1.05; a training beside it is not a session."""
    from gpuops.sim.fleet.workload import JobClass, PriorityClass

    classes = (PriorityClass("serve", 10), PriorityClass("batch", 0))
    service = JobClass("svc", "p", "serve", "inference", rate_per_hour=0.0, slowdown_objective=1.05)
    config = FleetConfig(
        pools=(PoolSpec("a", 1, 2, "A100"),),
        arrival_rate_per_min=0.0,
        initial_jobs=(),
        priority_classes=classes,
        job_classes=(service,),
    )
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    c = fleet.cluster
    svc = c.submit(JobSpec("inference", 1, "p", "a", 1800, job_class="svc", priority_class="serve"))
    c.submit(JobSpec("training", 1, "p", "a", 1800, priority_class="batch"))
    gpu = c.find_gpu(svc.gpu_uuids[0])[1]
    gpu.clock_locked_mhz = 470  # a third of the A100's 1410 MHz
    fleet.run_until(3600.0)
    report = recorder.report(c)
    serve = report.classes["serve"]
    assert serve.completed == 1
    assert serve.slowdown_p95 is not None and serve.slowdown_p95 > 1.05
    assert serve.over_objective == pytest.approx(1.0)
    assert report.classes["batch"].slowdown_p95 is None  # training is no session


def test_preemptions_and_restarts_are_counted_per_priority_class() -> None:
    """A job of a class that preempts stops a lower, preemptible one (a preemption of the
    lower class); a reclaimed training is requeued (a restart of its class); a culled notebook
    is neither."""
    from gpuops.sim.fleet.config import SchedulerSettings
    from gpuops.sim.fleet.workload import PriorityClass

    classes = (
        PriorityClass("high", 100, preempts=True, preemptible=False),
        PriorityClass("batch", 10),
        PriorityClass("dev", 50),
    )
    config = FleetConfig(
        pools=(PoolSpec("a", 1, 4, "A100"), PoolSpec("b", 1, 2, "A100")),
        arrival_rate_per_min=0.0,
        initial_jobs=(),
        priority_classes=classes,
        scheduler=SchedulerSettings(min_runtime_s=0.0),
    )
    recorder = Recorder()
    fleet = VirtualFleet(config, 0, None, scrape_interval_s=30.0, recorder=recorder)
    c = fleet.cluster
    low = c.submit(JobSpec("training", 4, "p", "a", 7200, priority_class="batch"))
    fleet.run_until(600.0)
    high = c.submit(JobSpec("training", 4, "q", "a", 1800, priority_class="high"))
    assert high.state == "running" and low.state == "queued" and low.preemptions == 1
    dev = c.submit(JobSpec("training", 1, "p", "b", 7200, priority_class="dev"))
    notebook = c.submit(JobSpec("notebook", 1, "p", "b", 7200, priority_class="dev"))
    fleet.run_until(1200.0)
    ops.reclaim(c, dev.gpu_uuids[0])
    ops.reclaim(c, notebook.gpu_uuids[0])
    fleet.run_until(1800.0)
    report = recorder.report(c)
    batch, dev_figures = report.classes["batch"], report.classes["dev"]
    assert (batch.preemptions, batch.restarts) == (1, 0)
    assert (dev_figures.preemptions, dev_figures.restarts, dev_figures.culled) == (0, 1, 1)
    assert report.to_json()["classes"]["dev"]["restarts"] == 1
