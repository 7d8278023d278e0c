"""End to end on a real Slurm: real slurmctld/slurmd, real Prometheus, the engine, a fake NVML
per node whose utilization the test sets. Prints the fault → drain and queue → power-up times."""

from __future__ import annotations

import time

import pytest

from tests.e2e.slurm.conftest import SlurmLoop
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_an_idle_gpu_job_is_warned_then_requeued(slurm_loop: SlurmLoop) -> None:
    loop, s = slurm_loop, slurm_loop.s
    job_id = s.slurm.submit("--gres=gpu:1", "-w", "gpu-b", "-o", "/dev/null", "--wrap", "sleep 300")
    wait_for(lambda: s.job(job_id)["job_state"] == "RUNNING", 20, "the job to run")
    # gpu-b's GRES index 0 is /dev/nvidia2: the fake NVML's GPU 0 there (minor number 2).
    for gpu in s.nvml["gpu-b"].gpus:
        gpu.util_gpu = 0
    allocated = wait_for(lambda: s.query(f'gpuops_gpu_allocated{{job="{job_id}"}}'), 20, "the join")
    assert [r["metric"]["uuid"] for r in allocated] == ["GPU-gpu-b-0"]
    wait_for(lambda: loop.executed("reclaim-idle-gpus"), 60, "reclaim-idle-gpus to act")
    (warned,) = loop.executed("warn-idle-gpus")
    assert warned[1].ok, warned[1].error
    assert warned[1].changed["job"] == job_id and warned[1].changed["warned"] is True
    (reclaimed,) = loop.executed("reclaim-idle-gpus")
    assert reclaimed[1].ok, reclaimed[1].error
    assert reclaimed[0].at > warned[0].at
    assert reclaimed[1].changed["reclaimed"] is True and reclaimed[1].changed["how"] == "requeue"
    job = s.job(job_id)
    assert job["restart_cnt"] == 1 and "gpuops:warned:" in job["admin_comment"]


def test_a_dead_node_is_drained_with_our_reason_and_resumed_on_clear(
    slurm_loop: SlurmLoop,
) -> None:
    loop, s = slurm_loop, slurm_loop.s
    job_id = s.slurm.submit("--gres=gpu:1", "-w", "gpu-a", "-o", "/dev/null", "--wrap", "sleep 300")
    wait_for(lambda: s.job(job_id)["job_state"] == "RUNNING", 20, "the job to run")
    fault = time.monotonic()
    s.slurm.kill_slurmd("gpu-a")
    s.stop_exporter("gpu-a")  # the node is gone: its exporter with it
    wait_for(
        lambda: str(s.node("gpu-a")["reason"]).startswith("gpuops:migrate-off-down-nodes:"),
        60,
        "gpu-a drained by gpuops",
    )
    print(f"\nfault -> drain: {time.monotonic() - fault:.1f} s")
    # The executor drains, then requeues: its outcome is recorded a moment after the drain.
    wait_for(lambda: loop.executed("migrate-off-down-nodes"), 30, "the migrate outcome")
    (migrated,) = loop.executed("migrate-off-down-nodes")
    assert migrated[1].ok, migrated[1].error
    assert migrated[1].changed["requeued_jobs"] == [job_id]
    assert "DRAIN" in s.node("gpu-a")["state_flags"]
    s.slurm.start_slurmd("gpu-a")
    s.start_exporter("gpu-a")
    wait_for(lambda: loop.executed("migrate-off-down-nodes", "clear"), 60, "the undo on clear")
    (resumed,) = loop.executed("migrate-off-down-nodes", "clear")
    assert resumed[1].ok and resumed[1].changed["resumed"] is True, resumed[1]
    assert "DRAIN" not in s.node("gpu-a")["state_flags"]


def test_a_node_an_admin_drained_is_never_resumed(slurm_loop: SlurmLoop) -> None:
    loop, s = slurm_loop, slurm_loop.s
    s.slurm.cmd("scontrol", "update", "nodename=gpu-b", "state=drain", "reason=GPU 3 ECC (ops)")
    s.stop_exporter("gpu-b")
    wait_for(lambda: loop.executed("migrate-off-down-nodes"), 60, "migrate to act")
    s.start_exporter("gpu-b")
    wait_for(lambda: loop.executed("migrate-off-down-nodes", "clear"), 60, "the undo on clear")
    (fired,) = loop.executed("migrate-off-down-nodes")
    (cleared,) = loop.executed("migrate-off-down-nodes", "clear")
    assert fired[1].ok and fired[1].changed["drained"] is False
    assert cleared[1].ok and cleared[1].changed["resumed"] is False
    node = s.node("gpu-b")
    assert node["reason"] == "GPU 3 ECC (ops)" and "DRAIN" in node["state_flags"]


def test_a_long_queue_powers_up_a_cloud_node_and_powers_it_down_when_idle(
    slurm_loop: SlurmLoop,
) -> None:
    loop, s = slurm_loop, slurm_loop.s
    queued = time.monotonic()
    # The jobs run until cancelled: the queue stays long until the scale-out, however slowly a
    # loaded machine scrapes and evaluates (with short jobs it could drain below 10 first).
    jobs = [
        s.slurm.submit("--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 300") for _ in range(20)
    ]
    wait_for(lambda: loop.executed("scale-out-on-queue"), 60, "scale-out to act")
    (scaled,) = loop.executed("scale-out-on-queue")
    assert scaled[1].ok and scaled[1].changed["powered_up"] == ["cloud-1"], scaled[1]
    wait_for(
        lambda: (
            s.node("cloud-1")["state"] in ("allocated", "mixed")
            and not {"POWERED_DOWN", "POWERING_UP"} & set(s.node("cloud-1")["state_flags"])
        ),
        60,
        "jobs to run on cloud-1",
    )
    print(f"\nqueue -> node powered up and running jobs: {time.monotonic() - queued:.1f} s")
    assert any(s.job(j)["nodes"] == "cloud-1" for j in jobs)
    # 18 of the 20 jobs waited: more than 10 for seconds. The burst is not needed any more.
    s.slurm.cmd("scancel", "-u", "root")
    wait_for(
        lambda: all(s.job(j)["job_state"] in ("COMPLETED", "CANCELLED") for j in jobs),
        60,
        "the queue to drain",
    )
    wait_for(
        lambda: (
            "POWERED_DOWN" in s.node("cloud-1")["state_flags"]
            or "POWERING_DOWN" in s.node("cloud-1")["state_flags"]
        ),
        60,
        "cloud-1 powered down",
    )
    downs = [o for _, o in loop.executed("scale-in-idle-cloud-nodes") if o.changed["powered_down"]]
    assert [o.changed["powered_down"] for o in downs] == [["cloud-1"]]
    # it fires only while a node gpuops powered up is idle, not for the idle static nodes: five
    # evaluations later (its repeat_interval is 2 s) at most one repeat, made before the scrape
    # after the power-down, found nothing left to power down — and says so
    registry = s.engine.metrics.registry
    labels = {"group": "capacity", "policy": "scale-in-idle-cloud-nodes"}

    def evaluations() -> float:
        return registry.get_sample_value("gpuops_engine_evaluations_total", labels) or 0.0

    since = evaluations()
    wait_for(lambda: evaluations() >= since + 5, 30, "five more evaluations of scale-in")
    s.engine.wait_idle(10)
    idle = [
        o for _, o in loop.executed("scale-in-idle-cloud-nodes") if not o.changed["powered_down"]
    ]
    assert len(idle) <= 1, idle
    assert all(o.changed["why"] for o in idle)
    for name in ("gpu-a", "gpu-b"):  # static nodes gpuops did not power up stay up
        assert not {"POWERED_DOWN", "POWERING_DOWN"} & set(s.node(name)["state_flags"])
