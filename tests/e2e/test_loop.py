"""End to end: each of the four shipped (demo-scale) policies acts on the simulated fleet through
a real Prometheus when its condition exists (the downclock once an admin grants it), none acts
without it, and a Prometheus outage produces no action."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuops.audit.spool import read_spool
from gpuops.sim.fleet import JobSpec
from tests.e2e.conftest import StartLoop
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

BUSY = (
    JobSpec("training", 2, "vision", node="node-0"),
    JobSpec("training", 2, "vision", node="node-1"),
)


def gpu(state: dict, uuid: str) -> dict:
    return next(g for n in state["nodes"] for g in n["gpus"] if g["uuid"] == uuid)


def test_reclaims_an_idle_allocated_gpu(start_loop: StartLoop) -> None:
    loop = start_loop((*BUSY, JobSpec("notebook", 1, "research", node="node-2")))
    idle = next(
        g for n in loop.state()["nodes"] for g in n["gpus"] if n["name"] == "node-2" and g["job"]
    )
    wait_for(lambda: loop.executed("reclaim-idle-gpus"), 60, "reclaim-idle-gpus to act")
    (outcome,) = loop.executed("reclaim-idle-gpus")
    assert outcome.ok, outcome.error
    state = loop.state()
    assert gpu(state, idle["uuid"])["job"] in (None, "")
    assert state["counters"]["reclaimed"] == 1
    decision = loop.fired("reclaim-idle-gpus")[0][0]
    assert decision.target.labels == {"node": "node-2", "uuid": idle["uuid"]}
    assert not loop.fired("scale-out-on-queue") and not loop.fired("migrate-off-down-nodes")


def test_downclocks_a_lightly_used_gpu_and_restores_it_when_load_returns(
    start_loop: StartLoop,
) -> None:
    loop = start_loop((*BUSY, JobSpec("light", 1, "recsys", node="node-2")))
    light = next(j for j in loop.state()["jobs"] if j["profile"] == "light")
    # the demo's downclock waits for an admin (approval: required): nothing runs before the grant
    (approval,) = wait_for(
        lambda: loop.engine.store.approvals("pending"), 60, "the downclock's approval"
    )
    assert loop.executed("downclock-underused-gpus") == []
    assert gpu(loop.state(), approval.decision.target.labels["uuid"])["clock_locked_mhz"] is None
    loop.engine.grant(approval.decision_id, "alice")
    wait_for(lambda: loop.executed("downclock-underused-gpus"), 60, "downclock to act")
    uuid = loop.fired("downclock-underused-gpus")[0][0].target.labels["uuid"]
    assert gpu(loop.state(), uuid)["clock_locked_mhz"] == 1100
    loop.post(f"/api/v1/jobs/{light['id']}/profile", {"profile": "training"})
    wait_for(
        lambda: loop.executed("downclock-underused-gpus", "clear"), 60, "restore_clocks on clear"
    )
    (restored,) = loop.executed("downclock-underused-gpus", "clear")
    assert restored.ok, restored.error
    assert gpu(loop.state(), uuid)["clock_locked_mhz"] is None
    assert not loop.fired("reclaim-idle-gpus")


def test_scales_out_when_the_queue_grows(start_loop: StartLoop) -> None:
    loop = start_loop(BUSY)
    before = len(loop.state()["nodes"])
    loop.post("/api/v1/pools/default/burst", {"count": 14, "gpus": 1, "duration_s": 600})
    wait_for(lambda: loop.executed("scale-out-on-queue"), 60, "scale-out-on-queue to act")
    assert all(o.ok for o in loop.executed("scale-out-on-queue"))
    state = loop.state()
    assert len(state["nodes"]) > before
    assert state["counters"]["nodes_added"] >= 1


def test_migrates_jobs_off_a_failed_node(start_loop: StartLoop) -> None:
    loop = start_loop(BUSY)
    loop.post("/api/v1/nodes/node-0/fail")
    wait_for(lambda: loop.executed("migrate-off-down-nodes"), 60, "migrate-off-down-nodes to act")
    (outcome,) = loop.executed("migrate-off-down-nodes")
    assert outcome.ok, outcome.error
    decision = loop.fired("migrate-off-down-nodes")[0][0]
    assert decision.target.labels == {"node": "node-0"}
    state = loop.state()
    assert state["counters"]["migrated"] + state["counters"]["requeued_by_migrate"] >= 1
    assert all(j["node"] != "node-0" for j in state["jobs"] if j["state"] == "running")


def test_nothing_fires_on_a_healthy_busy_fleet(start_loop: StartLoop) -> None:
    loop = start_loop((*BUSY, JobSpec("training", 2, "nlp", node="node-2")))
    # the longest `for` of the demo policies is 10 s on a 5 s interval: 6 cycles cover it twice
    for policy in (
        "reclaim-idle-gpus",
        "downclock-underused-gpus",
        "scale-out-on-queue",
        "migrate-off-down-nodes",
    ):
        wait_for(lambda p=policy: loop.evaluations(p) >= 6, 90, f"6 evaluations of {policy}")
    assert loop.decisions == []
    assert loop.state()["counters"] == {
        "reclaimed": 0,
        "migrated": 0,
        "requeued_by_migrate": 0,
        "nodes_added": 0,
        "downclocked": 0,
        "restored": 0,
        "packed": 0,
        "consolidated": 0,
        "moved": 0,
        "culled": 0,
    }


def test_prometheus_outage_produces_no_action(start_loop: StartLoop) -> None:
    loop = start_loop((*BUSY, JobSpec("notebook", 1, "research", node="node-2")))
    policy = "reclaim-idle-gpus"
    # the condition holds from the start; stop Prometheus before `for` (10 s) can elapse
    pending = wait_for(
        lambda: loop.engine.store.policy_state(policy).targets, 30, "the idle GPU to be pending"
    )
    loop.prometheus.stop()
    assert [t.status.value for t in pending.values()] == ["pending"]
    failures = loop.query_failures(policy)
    wait_for(lambda: loop.query_failures(policy) >= failures + 4, 60, "4 failed evaluations")
    assert loop.executed(policy) == []
    held = loop.engine.store.policy_state(policy).targets
    # held, not advanced; the first failed evaluation is noted (docs/policies.md, Fresh data)
    assert all(t.absent_since is not None for t in held.values())
    assert {k: replace(t, absent_since=None) for k, t in held.items()} == pending
    assert loop.state()["counters"]["reclaimed"] == 0
    docs = list(read_spool(loop.spool))
    skipped = [
        d
        for d in docs
        if d.get("rule", {}).get("name") == policy and d["event"]["outcome"] == "unknown"
    ]
    assert skipped, "skipped evaluations are audited"
