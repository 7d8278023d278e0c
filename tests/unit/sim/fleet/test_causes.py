"""Which decision stopped or acted on which jobs: the control API names the decision of each
call, and the fleet notes what that call did (the what-if's harm limits read it)."""

from __future__ import annotations

import json

from gpuops.sim.fleet import Cluster, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.causes import SCHEDULER, Stop
from gpuops.sim.fleet.config import ProjectSpec, SchedulerSettings
from gpuops.sim.fleet.control import Idempotency, dispatch
from gpuops.sim.fleet.workload import PriorityClass

CLASSES = (
    PriorityClass("serving", 90, preemptible=False),
    PriorityClass("high", 100, preempts=True),
    PriorityClass("routine", 50),
    PriorityClass("batch", 10, holdable=True),
)


def cluster(nodes: int = 1, reserved: int = 0, borrowing: bool = False) -> Cluster:
    return Cluster(
        FleetConfig(
            pools=(PoolSpec("a", nodes, 4, "A100", boot_s=300.0),),
            arrival_rate_per_min=0.0,
            initial_jobs=(),
            priority_classes=CLASSES,
            reservations=(ProjectSpec("owner", (("a", reserved),)),) if reserved else (),
            scheduler=SchedulerSettings(borrowing=borrowing, min_runtime_s=0.0),
        )
    )


def job(cls: str, gpus: int = 1, profile: str = "training", project: str = "p") -> JobSpec:
    return JobSpec(
        profile, gpus, project, pool="", duration_s=36000, priority_class=cls,
        checkpoint_interval_s=600,
    )  # fmt: skip


def call(c: Cluster, path: str, decision: str, **body: object) -> dict[str, object]:
    status, doc = dispatch(
        c, Idempotency(), "POST", path, json.dumps({"decision_id": decision, **body}).encode()
    )
    assert status == 200, doc
    return doc


def test_a_reclaim_is_its_decisions_a_priority_preemption_the_schedulers() -> None:
    c = cluster()
    notebook = c.submit(job("serving", profile="notebook"))
    training = c.submit(job("routine", gpus=3))
    call(c, f"/api/v1/gpus/{notebook.gpu_uuids[0]}/reclaim", "d-reclaim")
    call(c, f"/api/v1/gpus/{training.gpu_uuids[0]}/reclaim", "d-again")
    c.advance(60.0)
    # the high job preempts routine within the call of another decision: the scheduler's
    c.submit(job("high", gpus=4))
    assert c.jobs[training.id].state == "queued"
    assert c.causes.stops == {
        Stop("culled", "serving", "d-reclaim"): 1,
        Stop("restarted", "routine", "d-again"): 1,
        Stop("preempted", "routine", SCHEDULER): 1,
    }
    assert c.causes.acted == {"serving": {"d-reclaim"}, "routine": {"d-again"}}


def test_a_borrower_preempted_off_gpus_a_decision_lent_is_that_decisions() -> None:
    c = cluster(reserved=4)
    call(c, "/api/v1/pools/a/lend", "d-lend")
    borrower = c.submit(job("routine", gpus=4))
    assert borrower.state == "running" and borrower.borrowed
    c.advance(60.0)
    c.submit(job("routine", gpus=4, project="owner"))  # the owner takes its GPUs back
    assert c.causes.stops == {Stop("preempted", "routine", "d-lend"): 1}


def test_with_the_fleets_own_borrowing_the_preemption_is_the_schedulers() -> None:
    c = cluster(reserved=4, borrowing=True)
    call(c, "/api/v1/pools/a/lend", "d-lend")
    c.submit(job("routine", gpus=4))
    c.advance(60.0)
    c.submit(job("routine", gpus=4, project="owner"))
    assert c.causes.stops == {Stop("preempted", "routine", SCHEDULER): 1}


def test_jobs_that_waited_while_a_decision_kept_a_machine_down_are_its() -> None:
    c = cluster(nodes=2)
    call(c, "/api/v1/pools/a/scale_in", "d-down", node="node-1")
    c.submit(job("routine", gpus=4))
    waiting = c.submit(job("serving", gpus=4))
    assert waiting.state == "queued"
    c.advance(60.0)  # it waits a minute before a machine is powered up for it
    call(c, "/api/v1/pools/a/scale_out", "d-up")
    c.advance(300.0)  # booted: the waiting job starts
    assert waiting.state == "running"
    assert c.causes.acted == {"serving": {"d-down"}}
    # the machine is back: a job that waits now waits for GPUs, not for that decision
    c.submit(job("routine", gpus=4))
    c.advance(60.0)
    assert "routine" not in c.causes.acted


def test_a_hold_and_a_clock_cap_act_on_the_jobs_they_touch_the_cap_slows_them() -> None:
    c = cluster()
    capped = c.submit(job("routine"))
    call(c, f"/api/v1/gpus/{capped.gpu_uuids[0]}/clocks", "d-cap", max_clock_mhz=1100)
    call(c, "/api/v1/classes/batch/hold", "d-hold")
    assert c.causes.acted == {"routine": {"d-cap"}, "batch": {"d-hold"}}
    assert c.causes.slowed == {"routine": {"d-cap"}}
    assert not c.causes.stops


def test_calls_without_a_decision_and_the_clock_are_no_ones() -> None:
    c = cluster()
    notebook = c.submit(job("serving", profile="notebook"))
    ops.reclaim(c, notebook.gpu_uuids[0])  # in-process, no control call
    assert c.causes.stops == {Stop("culled", "serving", SCHEDULER): 1}
    assert not c.causes.acted


def test_jobs_the_scheduler_starts_during_a_call_are_not_that_decisions() -> None:
    c = cluster()
    training = c.submit(job("routine", gpus=4))
    waiting = c.submit(job("serving", gpus=4))
    c.advance(60.0)
    # the reclaim stops the training; the pass that ends the call starts the waiting job
    call(c, f"/api/v1/gpus/{training.gpu_uuids[0]}/reclaim", "d-reclaim")
    assert waiting.state == "running"
    assert c.causes.acted == {"routine": {"d-reclaim"}}
