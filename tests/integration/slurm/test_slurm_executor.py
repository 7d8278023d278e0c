"""The slurm executor against a real slurmctld: drains with our reason and resumes only ours,
warns before it reclaims, powers CLOUD nodes up and down, is idempotent by decision id, and
classifies failures (slurmctld down: temporary; an odd node name: permanent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuops.actions.base import execute
from gpuops.actions.retry import RetryPolicy
from gpuops.actions.slurm import SlurmExecutor
from gpuops.model.decisions import ActionSpec, Decision, Evidence, Outcome, Target, Transition
from gpuops.model.telling import effect
from gpuops.sim.slurmcluster import SlurmCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

NO_RETRY = RetryPolicy(attempts=1)


def decision(
    verb: str, did: str, policy: str = "migrate-off-down-nodes", **labels: str
) -> Decision:
    return Decision(
        id=did,
        policy=policy,
        group="capacity",
        target=Target.from_labels(labels, None),
        transition=Transition.CLEAR if verb in ("resume", "scale_in") else Transition.FIRE,
        action=ActionSpec(verb, "slurm", {}),
        evidence=Evidence("up == 0", 0.0, 0.0, 0.0),
        at=0.0,
        episode_start=0.0,
    )


def executor(slurm: SlurmCluster, **settings: Any) -> SlurmExecutor:
    return SlurmExecutor({"slurm_conf": str(slurm.conf), "timeout_s": 5, **settings})


def run(ex: SlurmExecutor, d: Decision) -> Outcome:
    return execute(ex, d, retry=NO_RETRY)


def node(slurm: SlurmCluster, name: str) -> dict[str, Any]:
    nodes = json.loads(slurm.cmd("sinfo", "--json"))["nodes"]
    found: dict[str, Any] = next(n for n in nodes if n["name"] == name)
    return found


def node_up(slurm: SlurmCluster, name: str) -> bool:
    n = node(slurm, name)
    return bool(
        n["state"] == "idle" and not {"POWERED_DOWN", "POWERING_UP"} & set(n["state_flags"])
    )


def job(slurm: SlurmCluster, job_id: str) -> dict[str, Any]:
    jobs = json.loads(slurm.cmd("squeue", "--json"))["jobs"]
    found: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
    return found


def running(slurm: SlurmCluster, *args: str) -> str:
    job_id = slurm.submit("-o", "/dev/null", *args, "--wrap", "sleep 120")
    wait_for(lambda: job(slurm, job_id)["job_state"] == "RUNNING", 20, f"job {job_id} to run")
    return job_id


def test_migrate_drains_with_our_reason_requeues_and_resume_undoes_only_ours(
    slurm: SlurmCluster,
) -> None:
    ex = executor(slurm)
    job_id = running(slurm, "--gres=gpu:1")
    first = job(slurm, job_id)["nodes"]
    other = {"gpu-a": "gpu-b", "gpu-b": "gpu-a"}[first]
    fire = decision("migrate", "d1", node=first)
    outcome = run(ex, fire)
    assert outcome.ok, outcome.error
    assert outcome.changed["requeued_jobs"] == [job_id]
    n = node(slurm, first)
    assert n["reason"] == "gpuops:migrate-off-down-nodes:d1" and "DRAIN" in n["state_flags"]
    wait_for(lambda: job(slurm, job_id)["job_state"] == "PENDING", 10, "the job requeued")
    # The same decision again (a retry, a restart): nothing changes a second time.
    again = run(ex, fire)
    assert again.ok and again.changed["requeued_jobs"] == [] and again.changed["drained"]
    # The requeued job starts again elsewhere (after cred_expire), not on the drained node.
    wait_for(lambda: job(slurm, job_id)["job_state"] == "RUNNING", 30, "the job to restart")
    assert job(slurm, job_id)["nodes"] == other
    undo = run(ex, decision("resume", "d2", node=first))
    assert undo.ok and undo.changed["resumed"] is True
    assert "DRAIN" not in node(slurm, first)["state_flags"]


def test_a_node_an_admin_drained_is_never_resumed(slurm: SlurmCluster) -> None:
    ex = executor(slurm)
    slurm.cmd("scontrol", "update", "nodename=gpu-b", "state=drain", "reason=bad DIMM (ops)")
    fire = run(ex, decision("migrate", "d3", node="gpu-b"))
    assert fire.ok and fire.changed["drained"] is False
    assert node(slurm, "gpu-b")["reason"] == "bad DIMM (ops)"
    undo = run(ex, decision("resume", "d4", node="gpu-b"))
    assert undo.ok and undo.changed["resumed"] is False
    n = node(slurm, "gpu-b")
    assert "DRAIN" in n["state_flags"] and n["reason"] == "bad DIMM (ops)"


def test_reclaim_needs_a_warning_first_and_spares_excluded_users(slurm: SlurmCluster) -> None:
    job_id = running(slurm, "--gres=gpu:1")
    ex = executor(slurm)
    policy = "reclaim-idle-gpus"
    early = run(ex, decision("reclaim", "r1", policy=policy, job=job_id))
    assert not early.ok and "was not warned first" in (early.error or "")
    assert job(slurm, job_id)["job_state"] == "RUNNING"
    spared = executor(slurm, reclaim={"exclude_users": ["root"]})
    skipped = run(spared, decision("notify", "w0", policy=policy, job=job_id))
    assert skipped.ok and skipped.changed["excluded"] == "user root"
    warned = run(ex, decision("notify", "w1", policy=policy, job=job_id))
    assert warned.ok and warned.changed["warned"] is True
    assert "gpuops:warned:w1@" in job(slurm, job_id)["admin_comment"]
    forged = "n1\ngpuops: ignore the line above"
    hostile = run(ex, decision("notify", "w2", policy=policy, job=job_id, node=forged))
    assert hostile.ok and "\n" not in hostile.changed["message"], "a label forges no line"
    assert "on 'n1\\ngpuops: ignore the line above' has been idle" in hostile.changed["message"]
    kept = run(spared, decision("reclaim", "r2", policy=policy, job=job_id))
    assert kept.ok and kept.changed["reclaimed"] is False
    assert job(slurm, job_id)["job_state"] == "RUNNING"
    done = run(ex, decision("reclaim", "r3", policy=policy, job=job_id))
    assert done.ok and done.changed == {
        "job": job_id,
        "reclaimed": True,
        "how": "requeue",
        "user": "root",
    }
    wait_for(lambda: job(slurm, job_id)["job_state"] == "PENDING", 10, "the job requeued")
    assert run(ex, decision("reclaim", "r3", policy=policy, job=job_id)).changed["already"]


def test_reclaim_can_cancel_instead(slurm: SlurmCluster) -> None:
    job_id = running(slurm, "--gres=gpu:1")
    ex = executor(slurm, reclaim={"how": "cancel", "require_warning": False})
    done = run(ex, decision("reclaim", "r4", policy="reclaim-idle-gpus", job=job_id))
    assert done.ok and done.changed["how"] == "cancel"
    wait_for(lambda: job(slurm, job_id)["job_state"] == "CANCELLED", 10, "the job to end")


def test_scale_out_powers_up_a_cloud_node_and_scale_in_only_idle_ones_we_powered(
    slurm: SlurmCluster,
) -> None:
    ex = executor(slurm)
    up = run(ex, decision("scale_out", "s1", policy="scale-out-on-queue", pool="gpu"))
    assert up.ok and up.changed["powered_up"] == ["cloud-1"], up.error
    assert run(ex, decision("scale_out", "s1", policy="scale-out-on-queue", pool="gpu")).changed[
        "already"
    ]
    wait_for(lambda: node_up(slurm, "cloud-1"), 30, "cloud-1 to be up")
    assert node(slurm, "cloud-1")["comment"] == "gpuops:scale_out:s1"
    job_id = running(slurm, "--gres=gpu:2", "-w", "cloud-1")
    busy = run(ex, decision("scale_in", "s2", policy="scale-out-on-queue", pool="gpu"))
    assert busy.ok and busy.changed["powered_down"] == []  # cloud-1 runs a job; gpu-a/b not ours
    assert busy.changed["why"] == "no idle node of partition gpu is one gpuops powered up"
    told = effect("scale_in", busy.changed)
    assert not told.did and told.text == (
        "no node powered down in pool gpu: no idle node of partition gpu is one gpuops powered up"
    )
    slurm.cmd("scancel", job_id)
    wait_for(lambda: node(slurm, "cloud-1")["state"] == "idle", 20, "cloud-1 to be idle")
    down = run(ex, decision("scale_in", "s3", policy="scale-out-on-queue", pool="gpu"))
    assert down.ok and down.changed["powered_down"] == ["cloud-1"]
    wait_for(
        lambda: "POWERED_DOWN" in node(slurm, "cloud-1")["state_flags"], 30, "cloud-1 powered down"
    )
    assert node(slurm, "gpu-a")["state"] == "idle" and node(slurm, "gpu-b")["state"] == "idle"


def test_odd_node_names_fail_permanently_and_slurm_down_is_temporary(slurm: SlurmCluster) -> None:
    ex = executor(slurm, timeout_s=2)
    for name in ("gpu-[a-b]", "gpu-a,gpu-b", "-h", "gpu a"):
        bad = run(ex, decision("migrate", "x1", node=name))
        assert not bad.ok and "is not a plain Slurm name" in (bad.error or ""), name
    assert "DRAIN" not in node(slurm, "gpu-a")["state_flags"]
    slurm.stop_controller()
    with pytest.raises(Exception) as raised:
        ex.run(decision("migrate", "x2", node="gpu-a"))
    assert type(raised.value).__name__ == "TemporaryError"
    assert "slurmctld" in str(raised.value)


def test_a_node_with_the_veto_feature_is_vetoed_for_the_gate(slurm: SlurmCluster) -> None:
    fire = decision("migrate", "d9", node="gpu-a")
    assert executor(slurm).standing(fire) is None  # no veto feature configured
    ex = executor(slurm, veto_feature="gpuops_do_not_touch")
    standing = ex.standing(fire)
    assert standing is not None and standing.veto is None
    slurm.cmd(
        "scontrol",
        "update",
        "nodename=gpu-a",
        "availablefeatures=fast,gpuops_do_not_touch",
        "activefeatures=fast,gpuops_do_not_touch",
    )
    standing = ex.standing(fire)
    assert standing is not None
    assert standing.veto == "node gpu-a has the Slurm feature gpuops_do_not_touch"
    other = ex.standing(decision("migrate", "d10", node="gpu-b"))
    assert other is not None and other.veto is None
    assert ex.standing(decision("migrate", "d11", node="no-such-node")) is None
