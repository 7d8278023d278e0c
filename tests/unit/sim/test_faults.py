"""The simulated fleet's fault model: draws at the stated rate, codes from the catalogue, the
ladder's steps healing what they heal, and an application flood that makes no GPU faulty."""

from __future__ import annotations

import random

import pytest

from gpuops.model.health.catalogue_file import shipped_catalogue
from gpuops.model.health.faults import xid_faults
from gpuops.sim.faults import (
    DAY_S,
    LLAMA3_PER_GPU_HOUR,
    FaultRates,
    FaultState,
    Fix,
    InjectedFault,
    app_flood,
    draw_faults,
    strike,
)
from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.model import SESSION_PROFILES, Job

GPUS = [(f"n{n:03d}", f"GPU-{n:03d}-{g}") for n in range(16) for g in range(8)]


def test_draws_match_the_scaled_rate_over_many_seeds() -> None:
    rates = FaultRates(scale=200)
    expected = rates.expected(len(GPUS), 3 * DAY_S)
    counts = [
        len(draw_faults(rates, GPUS, 0.0, 3 * DAY_S, shipped_catalogue(), random.Random(seed)))
        for seed in range(40)
    ]
    mean = sum(counts) / len(counts)
    assert 20 <= expected <= 40
    assert abs(mean - expected) < 0.15 * expected


def test_each_fault_has_a_code_that_acts_a_gpu_and_a_fix_in_time_order() -> None:
    catalogue = shipped_catalogue()
    faults = draw_faults(FaultRates(scale=500), GPUS, 100.0, DAY_S, catalogue, random.Random(7))
    assert faults
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(100.0 <= f.at < 100.0 + DAY_S for f in faults)
    for fault in faults:
        entry = catalogue.entry(fault.code)
        assert entry is not None and entry.acts
        assert (fault.node, fault.gpu) in GPUS
        assert [
            (x.node, x.gpu, x.entry.code) for x in xid_faults(catalogue, [fault.event()], fault.at)
        ] == [(fault.node, fault.gpu, fault.code)]


def test_the_published_rate_alone_gives_less_than_one_fault_on_a_small_fleet() -> None:
    assert LLAMA3_PER_GPU_HOUR * 128 * 72 < 1
    assert (
        draw_faults(FaultRates(scale=0), GPUS, 0.0, DAY_S, shipped_catalogue(), random.Random(1))
        == []
    )


def test_a_bad_rate_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="base 'meta' is not one of llama3, rsc"):
        FaultRates(scale=1, base="meta")
    with pytest.raises(ValueError, match="scale -1 is negative"):
        FaultRates(scale=-1)


def _fault(gpu: str, fix: Fix) -> InjectedFault:
    return InjectedFault(0.0, "n1", gpu, "hbm3", 48, fix)


def test_the_ladder_steps_heal_what_they_heal() -> None:
    state = FaultState()
    state.inject(_fault("GPU-a", Fix.RESET))
    state.inject(_fault("GPU-b", Fix.REBOOT))
    assert state.validate("n1")[0] is False
    assert state.reset_gpu("n1", "GPU-b", 10.0) is False
    assert state.reset_gpu("n1", "GPU-a", 20.0) is False
    assert state.validate("n1") == (False, "GPU-b: XID 48 (hbm3)")
    assert state.reboot("n1", 30.0) is True
    assert state.validate("n1") == (True, "")
    assert [(f.gpu, step, at) for f, step, at in state.healed] == [
        ("GPU-a", "reset_gpu", 20.0),
        ("GPU-b", "reboot", 30.0),
    ]


def test_a_part_to_replace_survives_every_step_until_a_human_replaces_it() -> None:
    state = FaultState()
    state.inject(_fault("GPU-a", Fix.REPLACE))
    assert state.reset_gpu("n1", "GPU-a", 1.0) is False
    assert state.reboot("n1", 2.0) is False
    assert state.faulty("n1")
    state.replace("n1", 3.0)
    assert not state.faulty("n1")


def test_one_crashed_job_raising_xid_45_on_80_nodes_makes_no_gpu_faulty() -> None:
    nodes = [(f"n{n:03d}", f"GPU-{n:03d}-0") for n in range(80)]
    events = app_flood("job-1", nodes, at=50.0)
    assert len(events) == 80 and {e.code for e in events} == {45}
    assert xid_faults(shipped_catalogue(), events, 60.0) == []


def _has_work_to_lose(job: Job) -> bool:
    return (
        job.profile not in SESSION_PROFILES
        and job.duration_s is not None
        and job.remaining_s is not None
        and job.duration_s > job.remaining_s
    )


def test_a_fault_kills_the_jobs_on_its_gpu_and_requeues_them_losing_their_work() -> None:
    cluster = Cluster(FleetConfig(seed=3))
    for _ in range(60):
        cluster.advance(10.0)
    node, gpu = next(
        (n, g)
        for n in cluster.nodes.values()
        for g in n.gpus
        if g.job is not None and _has_work_to_lose(cluster.jobs[g.job])
    )
    job = cluster.jobs[gpu.job or ""]
    before = cluster.restart_lost_gpu_s
    killed, charged = strike(
        cluster, InjectedFault(cluster.time, node.name, gpu.uuid, "hbm3", 48, Fix.RESET)
    )
    assert killed == [job.id]
    assert job.state == "queued" and job.node is None and gpu.job is None
    assert charged > 0 and cluster.restart_lost_gpu_s > before
    assert strike(
        cluster, InjectedFault(cluster.time, "nowhere", "GPU-x", "hbm3", 48, Fix.RESET)
    ) == ([], 0.0)
