"""The ``kubernetes`` executor against the fake API server (``tests.fakes.kube_apiserver``),
through the official client over loopback: cordon with ownership, drain by eviction with
PodDisruptionBudgets, the undo, reclaim through the owner chain, node groups through /scale,
conflicts, RBAC refusals, hostile labels."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.kubernetes import KubernetesExecutor
from gpuops.integrations.kubernetes import names
from gpuops.integrations.kubernetes.client import check_kubeconfig
from gpuops.model.decisions import Decision, Transition
from gpuops.sim.fleet.remotewrite import RemoteWriter
from gpuops.sources.promproc import PrometheusServer
from tests.fakes.gpu_pods import GpuPods
from tests.fakes.kube_apiserver import FakeApiServer
from tests.integration.actions.kube import (
    Sleeps,
    decision,
    deployment,
    executor,
    machinedeployment,
    node,
    pdb,
    pod,
    replicaset,
    settings,
)
from tests.waiting import wait_for


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.put("", "nodes", node("gpu-1"))
    server.put("", "nodes", node("gpu-2"))
    server.put("", "nodes", node("cpu-1") | {"metadata": {"name": "cpu-1", "labels": {}}})
    server.put("", "pods", pod("train-a", "gpu-1", labels={"app": "train"}))
    server.put("", "pods", pod("serve-b", "gpu-1", labels={"app": "serve"}))
    server.put("", "pods", pod("dcgm", "gpu-1", namespace="gpu", owner=("DaemonSet", "dcgm")))
    server.put("", "pods", pod("proxy", "gpu-1", namespace="kube-system"))
    server.put(
        "", "pods", pod("static", "gpu-1", namespace="ml", annotations={names.MIRROR_POD: "abc"})
    )
    server.put("", "pods", pod("other", "gpu-2"))
    yield server
    server.close()


def _node(api: FakeApiServer, name: str = "gpu-1") -> dict:  # type: ignore[type-arg]
    return api.get("", "nodes", name)


def test_migrate_cordons_with_ownership_and_evicts_what_may_be_evicted(
    api: FakeApiServer, tmp_path: Path
) -> None:
    k = executor(api, tmp_path, taint=True)
    done = k.run(decision("migrate", node="gpu-1"))
    n = _node(api)
    assert n["spec"]["unschedulable"] is True
    a = n["metadata"]["annotations"]
    assert a[names.CORDONED_BY] == "migrate-off-down-nodes"
    assert a[names.DECISION] == "0123456789abcdef01234567"
    assert a[names.EPISODE] == "1000.000" and a[names.REASON] == "node down"
    assert n["spec"]["taints"] == [
        {"key": names.TAINT_KEY, "value": "migrate-off-down-nodes", "effect": "NoSchedule"}
    ]
    condition = [c for c in n["status"]["conditions"] if c["type"] == names.CONDITION_TYPE]
    assert condition[0]["status"] == "True" and condition[0]["reason"] == "GpuopsMigrate"
    assert done["cordoned"] is True
    assert sorted(done["evicted"]) == ["ml/serve-b", "ml/train-a"]
    assert sorted(done["skipped"]) == [
        "gpu/dcgm (DaemonSet)",
        "kube-system/proxy (system namespace)",
        "ml/static (mirror pod)",
    ]
    assert api.get("", "pods", "train-a", "ml")["metadata"]["deletionTimestamp"]
    assert not api.get("", "pods", "other", "ml")["metadata"].get("deletionTimestamp")
    evictions = [r for r in api.requests if r.path.endswith("/eviction")]
    assert len(evictions) == 2
    # one LIST of nodes, one PATCH, one status PATCH, one LIST of pods, two evictions
    assert done["api_calls"] == 6


def test_a_pdb_holds_a_pod_backoff_doubles_to_two_minutes_then_the_outcome_names_it(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("policy", "poddisruptionbudgets", pdb("train-pdb", "train", allowed=0))
    sleeps = Sleeps()
    k = executor(api, tmp_path, sleeps, drain={"timeout_s": 400})
    done = k.run(decision("migrate", node="gpu-1"))
    assert sleeps.slept == [10, 20, 40, 80, 120, 120, 10]
    assert done["held"] == [
        "ml/train-a: Cannot evict pod as it would violate the pod's disruption budget. "
        "(The disruption budget train-pdb needs 1 healthy pods and has 1 currently)"
    ]
    assert done["budgets"] == ["ml/train-pdb (disruptionsAllowed 0)"]
    assert done["evicted"] == ["ml/serve-b"] and done["cordoned"] is True
    assert _node(api)["spec"]["unschedulable"] is True
    assert not api.get("", "pods", "train-a", "ml")["metadata"].get("deletionTimestamp")
    assert [r for r in api.requests if r.method == "DELETE"] == []


def test_a_pdb_that_allows_again_lets_the_drain_finish(api: FakeApiServer, tmp_path: Path) -> None:
    api.put("policy", "poddisruptionbudgets", pdb("train-pdb", "train", allowed=0))
    sleeps = Sleeps()

    def sleep(seconds: float) -> None:
        sleeps.sleep(seconds)
        if sleeps.now >= 30:  # the replacement became healthy elsewhere
            api.edit(
                "policy",
                "poddisruptionbudgets",
                "train-pdb",
                "ml",
                status={"disruptionsAllowed": 1},
            )

    k = executor(api, tmp_path, sleeps)
    k.drainer.sleep = sleep
    done = k.run(decision("migrate", node="gpu-1"))
    assert sorted(done["evicted"]) == ["ml/serve-b", "ml/train-a"]
    assert sleeps.slept == [10, 20]


def test_delete_after_timeout_deletes_and_force_delete_only_when_the_policy_asks(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("policy", "poddisruptionbudgets", pdb("train-pdb", "train", allowed=0))
    modes = {
        "timeout_s": 30,
        "modes": [{"namespace": "ml", "selector": "app=train", "mode": "delete-after-timeout"}],
    }
    done = executor(api, tmp_path, drain=modes).run(decision("migrate", node="gpu-1"))
    assert done["deleted"] == ["ml/train-a"]
    deletes = [r for r in api.requests if r.method == "DELETE"]
    assert [r.path for r in deletes] == ["/api/v1/namespaces/ml/pods/train-a"]


def test_a_repeated_decision_cordons_once(api: FakeApiServer, tmp_path: Path) -> None:
    k = executor(api, tmp_path)
    k.run(decision("migrate", node="gpu-1"))
    before = len([r for r in api.requests if r.path == "/api/v1/nodes/gpu-1"])
    again = k.run(decision("migrate", node="gpu-1"))
    assert again["cordoned"] is True and again["evicted"] == []
    assert len([r for r in api.requests if r.path == "/api/v1/nodes/gpu-1"]) == before


def test_a_node_cordoned_before_gpuops_keeps_its_cordon_and_is_never_uncordoned(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.edit("", "nodes", "gpu-1", spec={"unschedulable": True})
    k = executor(api, tmp_path)
    done = k.run(decision("migrate", node="gpu-1"))
    assert done["cordoned"] is False and "before gpuops" in done["why"]
    assert names.CORDONED_BY not in (_node(api)["metadata"].get("annotations") or {})
    undo = k.run(decision("resume", did="undo", transition=Transition.CLEAR, node="gpu-1"))
    assert undo == {
        "node": "gpu-1",
        "uncordoned": False,
        "why": "not cordoned by gpuops in this episode: left as it is",
    }
    assert _node(api)["spec"]["unschedulable"] is True


def test_resume_uncordons_its_own_episode_only(api: FakeApiServer, tmp_path: Path) -> None:
    k = executor(api, tmp_path, taint=True)
    k.run(decision("migrate", node="gpu-1"))
    other = k.run(
        decision("resume", did="u0", transition=Transition.CLEAR, episode=5.0, node="gpu-1")
    )
    assert other["uncordoned"] is False
    undo = k.run(decision("resume", did="u1", transition=Transition.CLEAR, node="gpu-1"))
    assert undo == {"node": "gpu-1", "uncordoned": True}
    n = _node(api)
    assert "unschedulable" not in n["spec"] and "taints" not in n["spec"]
    assert not any(k.startswith("gpuops.io/") for k in n["metadata"].get("annotations") or {})
    condition = [c for c in n["status"]["conditions"] if c["type"] == names.CONDITION_TYPE]
    assert condition[0]["status"] == "False"


def test_an_uncordon_by_someone_else_cancels_the_episode(
    api: FakeApiServer, tmp_path: Path
) -> None:
    k = executor(api, tmp_path)
    k.run(decision("migrate", node="gpu-1"))
    api.edit("", "nodes", "gpu-1", spec={"unschedulable": None})  # kubectl uncordon
    again = k.run(decision("migrate", did="repeat-1", node="gpu-1"))
    assert again["cordoned"] is False and "someone else uncordoned" in again["why"]
    n = _node(api)
    assert "unschedulable" not in n["spec"]
    assert n["metadata"]["annotations"][names.CANCELLED] == "1000.000"
    undo = k.run(decision("resume", did="u1", transition=Transition.CLEAR, node="gpu-1"))
    assert undo["uncordoned"] is False


def test_a_conflict_is_read_again_and_retried(api: FakeApiServer, tmp_path: Path) -> None:
    edits = []

    def meanwhile(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1" and not edits:
            edits.append(path)  # another controller writes a label first
            api.edit("", "nodes", "gpu-1", metadata={"labels": {"zone": "b"}})

    api.before = meanwhile
    done = executor(api, tmp_path).run(decision("migrate", node="gpu-1"))
    assert done["cordoned"] is True
    n = _node(api)
    assert n["spec"]["unschedulable"] is True and n["metadata"]["labels"]["zone"] == "b"
    assert len([r for r in api.requests if r.method == "PATCH" and r.path.endswith("gpu-1")]) == 2


def test_a_gpu_level_fault_evicts_only_the_pods_of_that_gpu(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The node is not cordoned (its other GPUs stay in service; the device plugin keeps new
    pods off the bad one), so nothing is left for an undo the policy does not have."""
    k = executor(api, tmp_path)
    done = k.run(decision("migrate", node="gpu-1", uuid="GPU-7", namespace="ml", pod="train-a"))
    assert done["cordoned"] is False and done["evicted"] == ["ml/train-a"]
    assert done["why"] == "a GPU-level fault: not cordoned"
    assert "unschedulable" not in _node(api)["spec"]
    assert not (_node(api)["metadata"].get("annotations") or {})
    assert not api.get("", "pods", "serve-b", "ml")["metadata"].get("deletionTimestamp")
    free = k.run(decision("migrate", did="d2", node="gpu-2", uuid="GPU-9", namespace="", pod=""))
    assert free["cordoned"] is False and free["evicted"] == []
    assert "unschedulable" not in _node(api, "gpu-2")["spec"]
    with pytest.raises(PermanentError, match="runs on 'gpu-2', not on the target's node"):
        k.run(
            decision("migrate", did="d3", node="gpu-1", uuid="GPU-8", namespace="ml", pod="other")
        )


def test_a_gpu_level_fault_cordons_its_node_when_the_policy_asks(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The remediation ladder's quarantine (``params.cordon``): the node is cordoned, as gpuops'
    own, and only the faulty GPU's pods are evicted; the undo lifts that cordon only."""
    k = executor(api, tmp_path)
    gpu = {"node": "gpu-1", "uuid": "GPU-7", "namespace": "ml", "pod": "train-a"}
    done = k.run(decision("migrate", params={"cordon": True}, **gpu))
    assert done["cordoned"] is True and done["evicted"] == ["ml/train-a"]
    assert _node(api)["spec"]["unschedulable"] is True
    assert _node(api)["metadata"]["annotations"][names.CORDONED_BY] == "migrate-off-down-nodes"
    assert not api.get("", "pods", "serve-b", "ml")["metadata"].get("deletionTimestamp")
    standing = k.standing(decision("migrate", did="d2", params={"cordon": True}, **gpu))
    assert standing.population == 2  # it takes the node out: max_fraction counts it
    undo = k.run(decision("resume", did="u1", transition=Transition.CLEAR, node="gpu-1"))
    assert undo == {"node": "gpu-1", "uncordoned": True}
    with pytest.raises(PermanentError, match="params.cordon of migrate must be true or false"):
        k.run(decision("migrate", did="d3", params={"cordon": "yes"}, **gpu))


def test_reclaim_scales_the_deployment_to_zero_and_keeps_its_replicas(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("apps", "deployments", deployment("train", 3))
    api.put("apps", "replicasets", replicaset("train-6d4f", "train"))
    api.put("", "pods", pod("train-6d4f-x", "gpu-2", owner=("ReplicaSet", "train-6d4f")))
    k = executor(api, tmp_path)
    d = decision(
        "reclaim",
        policy="reclaim-idle-gpus",
        node="gpu-2",
        uuid="GPU-1",
        namespace="ml",
        pod="train-6d4f-x",
    )
    done = k.run(d)
    assert done == {
        "pod": "ml/train-6d4f-x",
        "reclaimed": True,
        "owner": "Deployment ml/train",
        "previous_replicas": 3,
    }
    dep = api.get("apps", "deployments", "train", "ml")
    assert dep["spec"]["replicas"] == 0
    assert dep["metadata"]["annotations"][names.PREVIOUS_REPLICAS] == "3"
    assert any(
        r.path.endswith("/deployments/train/scale") and r.method == "PUT" for r in api.requests
    )
    assert k.run(d)["already"] is True


def test_reclaim_suspends_a_job_deactivates_a_kueue_workload_and_leaves_a_bare_pod(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(
        "batch",
        "jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "sweep", "namespace": "ml", "uid": "uid-sweep"},
            "spec": {"template": {}},
        },
    )
    api.put(
        "batch",
        "jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "queued",
                "namespace": "ml",
                "uid": "uid-queued",
                "labels": {names.KUEUE_QUEUE: "gpus"},
            },
            "spec": {"suspend": False},
        },
    )
    api.put(
        "kueue.x-k8s.io",
        "workloads",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": "job-queued-1",
                "namespace": "ml",
                "labels": {names.KUEUE_JOB_UID: "uid-queued"},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": "queued",
                        "uid": "uid-queued",
                        "controller": True,
                    }
                ],
            },
            "spec": {"active": True, "queueName": "gpus"},
        },
    )
    api.put("", "pods", pod("sweep-1", "gpu-2", owner=("Job", "sweep")))
    api.put("", "pods", pod("queued-1", "gpu-2", owner=("Job", "queued")))
    api.put("", "pods", pod("bare", "gpu-2"))
    k = executor(api, tmp_path)

    def reclaim(name: str) -> dict:  # type: ignore[type-arg]
        return dict(
            k.run(
                decision("reclaim", did=name, node="gpu-2", uuid="GPU-1", namespace="ml", pod=name)
            )
        )

    assert reclaim("sweep-1")["owner"] == "Job ml/sweep"  # Kueue knows no Workload of it
    assert api.get("batch", "jobs", "sweep", "ml")["spec"]["suspend"] is True
    assert reclaim("queued-1")["owner"] == "Workload ml/job-queued-1"
    assert api.get("kueue.x-k8s.io", "workloads", "job-queued-1", "ml")["spec"]["active"] is False
    assert api.get("batch", "jobs", "queued", "ml")["spec"]["suspend"] is False  # Kueue's
    workloads = [r.path for r in api.requests if "workloads" in r.path]
    assert workloads[0] == "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads"
    assert reclaim("bare") == {
        "pod": "ml/bare",
        "reclaimed": False,
        "why": "a pod without owner: left alone",
    }


def test_scale_out_within_the_maximum_and_scale_in_only_what_gpuops_added(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("cluster.x-k8s.io", "machinedeployments", machinedeployment("gpu-a100", 2))
    k = executor(api, tmp_path)
    out = k.run(decision("scale_out", did="o1", params={"nodes": 3}, pool="a100"))
    assert out == {"pool": "a100", "replicas": 4, "previous": 2, "scaled_out": 2}
    assert k.run(decision("scale_out", did="o1", params={"nodes": 3}, pool="a100"))["already"]
    full = k.run(decision("scale_out", did="o2", params={"nodes": 1}, pool="a100"))
    assert full["why"] == "at its maximum (4 replicas)"
    down = k.run(decision("scale_in", did="i1", params={"nodes": 5}, pool="a100"))
    assert down == {"pool": "a100", "replicas": 2, "previous": 4, "scaled_out": 0}
    none = k.run(decision("scale_in", did="i2", params={"nodes": 1}, pool="a100"))
    assert none["replicas"] == 2 and "added no replica" in none["why"]
    md = api.get("cluster.x-k8s.io", "machinedeployments", "gpu-a100", "capi")
    assert md["spec"]["replicas"] == 2 and md["metadata"]["annotations"][names.SCALED_OUT] == "0"
    with pytest.raises(PermanentError, match="pool 'h100' has no scalable resource"):
        k.run(decision("scale_out", did="o3", pool="h100"))


@pytest.mark.parametrize("value", ["../gpu-2", "a/b", "gpu-1?x=", "%2F", "..", "gpu-1/../gpu-2"])
def test_a_hostile_node_label_names_nothing(api: FakeApiServer, tmp_path: Path, value: str) -> None:
    with pytest.raises(PermanentError, match="is not a Kubernetes name"):
        executor(api, tmp_path).run(decision("migrate", node=value))
    assert api.writes() == []


@pytest.mark.parametrize("value", ["../other", "a/b", "x?y=", "%2Fother", ".."])
def test_a_hostile_pod_label_names_nothing(api: FakeApiServer, tmp_path: Path, value: str) -> None:
    k = executor(api, tmp_path)
    with pytest.raises(PermanentError, match="is not a Kubernetes name"):
        k.run(decision("reclaim", node="gpu-1", uuid="GPU-1", namespace="ml", pod=value))
    with pytest.raises(PermanentError, match="is not a Kubernetes name"):
        k.run(decision("reclaim", node="gpu-1", uuid="GPU-1", namespace=value, pod="train-a"))
    assert api.writes() == []


def test_a_node_outside_the_selector_or_vetoed_is_not_touched(
    api: FakeApiServer, tmp_path: Path
) -> None:
    k = executor(api, tmp_path)
    with pytest.raises(PermanentError, match="not among the nodes of executors.kubernetes"):
        k.run(decision("migrate", node="cpu-1"))
    api.edit("", "nodes", "gpu-2", metadata={"labels": {names.VETO_LABEL: "true"}})
    assert k.standing(decision("migrate", node="gpu-2")).veto == (
        "node gpu-2 is labelled gpuops.io/do-not-touch=true"
    )
    with pytest.raises(PermanentError, match="labelled gpuops.io/do-not-touch=true"):
        k.run(decision("migrate", node="gpu-2"))
    assert api.writes() == []


def test_standing_counts_every_node_unschedulable_or_not_ready(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("", "nodes", node("gpu-3", ready=False))
    api.put("", "nodes", node("gpu-4"))
    api.edit("", "nodes", "gpu-4", spec={"unschedulable": True})  # an admin's cordon
    standing = executor(api, tmp_path).standing(decision("migrate", node="gpu-1"))
    assert standing.veto is None
    assert standing.unavailable == frozenset({"gpu-3", "gpu-4"})
    assert standing.population == 4


def test_rbac_refusals_name_the_verb_and_resource(api: FakeApiServer, tmp_path: Path) -> None:
    api.allowed = {
        ("list", "", "nodes"),
        ("patch", "", "nodes"),
        ("patch", "", "nodes/status"),
        ("list", "", "pods"),
    }
    k = executor(api, tmp_path)
    done = k.run(decision("migrate", node="gpu-1"))  # cordoned: the outcome says the rest
    assert done["cordoned"] is True
    assert "the drain failed: RBAC: gpuops needs verb 'create' on pods/eviction" in done["why"]
    api.allowed = {("list", "", "nodes")}
    with pytest.raises(PermanentError, match=r"RBAC: gpuops needs verb 'patch' on nodes"):
        k.run(decision("migrate", did="d2", node="gpu-2"))


def test_bad_credentials_are_permanent_and_an_absent_server_temporary(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A 401 is first temporary (an exec plugin's credentials expired: the client is built
    again from the kubeconfig), then permanent when the fresh credentials are refused too."""
    k = executor(api, tmp_path)
    api.token = "rotated"
    with pytest.raises(TemporaryError, match=r"refused the credentials .*built again"):
        k.run(decision("migrate", node="gpu-1"))
    with pytest.raises(PermanentError, match=r"refused the credentials \(401 Unauthorized\)"):
        k.run(decision("migrate", node="gpu-1"))
    (tmp_path / "kubeconfig").write_text(api.kubeconfig("rotated"), encoding="utf-8")
    undo = k.run(decision("resume", did="u", transition=Transition.CLEAR, node="gpu-1"))
    assert undo["uncordoned"] is False  # answered: the client was built again
    api.close()
    with pytest.raises(TemporaryError, match=f"API server {api.url} unreachable"):
        k.run(decision("migrate", node="gpu-1"))


def test_no_node_selector_no_executor() -> None:
    from gpuops.actions.kubernetes import KubernetesExecutor

    with pytest.raises(ValueError, match="node_selector: Field required"):
        KubernetesExecutor({})
    with pytest.raises(ValueError, match="an empty one would select every node"):
        KubernetesExecutor({"node_selector": " "})
    with pytest.raises(ValueError, match="'a b' is not a label selector requirement"):
        KubernetesExecutor({"node_selector": "a b"})


def test_allow_completion_lets_a_pod_finish_before_the_deadline(
    api: FakeApiServer, tmp_path: Path
) -> None:
    sleeps = Sleeps()

    def sleep(seconds: float) -> None:
        sleeps.sleep(seconds)
        api.edit("", "pods", "train-a", "ml", status={"phase": "Succeeded"})

    modes = {"modes": [{"selector": "app=train", "mode": "allow-completion"}]}
    k = executor(api, tmp_path, sleeps, drain=modes)
    k.drainer.sleep = sleep
    done = k.run(decision("migrate", node="gpu-1"))
    assert done["evicted"] == ["ml/serve-b"]
    assert "ml/train-a (finished)" in done["skipped"]
    assert sleeps.slept == [10]


def test_calls_per_decision(api: FakeApiServer, tmp_path: Path) -> None:
    """What each verb costs the API server (the docs' table)."""
    api.put("apps", "deployments", deployment("train", 3))
    api.put("apps", "replicasets", replicaset("train-6d4f", "train"))
    api.put("", "pods", pod("train-6d4f-x", "gpu-2", owner=("ReplicaSet", "train-6d4f")))
    api.put("cluster.x-k8s.io", "machinedeployments", machinedeployment("gpu-a100", 2))
    k = executor(api, tmp_path)

    def calls(d: Decision) -> int:
        before = len(api.requests)
        k.run(d)
        return len(api.requests) - before

    assert calls(decision("migrate", node="gpu-1")) == 4 + 2  # + one eviction per pod
    assert calls(decision("resume", did="u", transition=Transition.CLEAR, node="gpu-1")) == 3
    reclaim = decision("reclaim", did="r", namespace="ml", pod="train-6d4f-x")
    assert calls(reclaim) == 7  # pod, nodes, ReplicaSet, Deployment, scale, patch, PUT scale
    assert calls(decision("scale_out", did="s", pool="a100")) == 4


def test_a_missing_kubeconfig_fails_the_action_temporarily_naming_it(tmp_path: Path) -> None:
    from gpuops.actions.kubernetes import KubernetesExecutor

    k = KubernetesExecutor({"kubeconfig": str(tmp_path / "none"), "node_selector": "a=b"})
    with pytest.raises(TemporaryError, match=f"kubeconfig {tmp_path}/none cannot be loaded"):
        k.run(decision("migrate", node="gpu-1"))


def test_a_job_is_suspended_where_kueue_is_not_installed(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """No Workload resource is served (404 on its list): the Job is suspended itself."""
    api.put(
        "batch",
        "jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "sweep", "namespace": "ml", "uid": "uid-sweep"},
            "spec": {"template": {}},
        },
    )
    api.put("", "pods", pod("sweep-1", "gpu-2", owner=("Job", "sweep")))
    api.serves_only = {"", "apps", "batch", "policy"}
    k = executor(api, tmp_path)
    done = k.run(decision("reclaim", node="gpu-2", uuid="GPU-1", namespace="ml", pod="sweep-1"))
    assert done["owner"] == "Job ml/sweep"
    assert api.get("batch", "jobs", "sweep", "ml")["spec"]["suspend"] is True
    queued = {"name": "queued", "namespace": "ml", "labels": {names.KUEUE_QUEUE: "gpus"}}
    api.put("batch", "jobs", {"kind": "Job", "metadata": queued, "spec": {"suspend": False}})
    api.put("", "pods", pod("queued-1", "gpu-2", owner=("Job", "queued")))
    with pytest.raises(TemporaryError, match="queued by Kueue .* serves no kueue.x-k8s.io"):
        k.run(
            decision("reclaim", did="q", node="gpu-2", uuid="GPU-1", namespace="ml", pod="queued-1")
        )
    assert api.get("batch", "jobs", "queued", "ml")["spec"]["suspend"] is False  # never


def test_kueue_is_called_at_the_version_discovery_finds_and_its_job_never_suspended(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """An older Kueue serving only v1beta1: found through discovery; a Kueue Job whose
    Workload does not exist yet is a temporary error, never a suspended Job."""
    api.served["kueue.x-k8s.io"] = ("v1beta1",)
    job = api.put(
        "batch",
        "jobs",
        {
            "kind": "Job",
            "metadata": {"name": "q", "namespace": "ml", "labels": {names.KUEUE_QUEUE: "gpus"}},
            "spec": {"suspend": False},
        },
    )
    api.put("", "pods", pod("q-1", "gpu-2", owner=("Job", "q")))
    k = executor(api, tmp_path)
    d = decision("reclaim", did="r1", node="gpu-2", uuid="GPU-1", namespace="ml", pod="q-1")
    with pytest.raises(TemporaryError, match="has no Workload yet"):
        k.run(d)
    owner = {"kind": "Job", "name": "q", "uid": job["metadata"]["uid"], "controller": True}
    api.put(
        "kueue.x-k8s.io",
        "workloads",
        {
            "kind": "Workload",
            "metadata": {
                "name": "job-q",
                "namespace": "ml",
                "labels": {names.KUEUE_JOB_UID: job["metadata"]["uid"]},
                "ownerReferences": [owner],
            },
            "spec": {"active": True},
        },
    )
    assert k.run(d)["owner"] == "Workload ml/job-q"
    assert api.get("kueue.x-k8s.io", "workloads", "job-q", "ml")["spec"]["active"] is False
    assert api.get("batch", "jobs", "q", "ml")["spec"]["suspend"] is False
    assert any(
        r.path == "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads" for r in api.requests
    )


def test_a_gpu_target_finds_its_pod_through_prometheus(api: FakeApiServer, tmp_path: Path) -> None:
    """The shipped reclaim-idle-gpus (target node, uuid): dcgm-exporter's series names the pod."""
    api.put("apps", "deployments", deployment("train", 3))
    api.put("apps", "replicasets", replicaset("train-6d4f", "train"))
    api.put("", "pods", pod("train-6d4f-x", "gpu-2", owner=("ReplicaSet", "train-6d4f")))
    prometheus = GpuPods({"GPU-1": ("gpu-2", "ml", "train-6d4f-x")})
    try:
        k = executor(api, tmp_path, reclaim={"prometheus_url": prometheus.url})
        done = k.run(decision("reclaim", policy="reclaim-idle-gpus", node="gpu-2", uuid="GPU-1"))
        assert done["owner"] == "Deployment ml/train" and done["reclaimed"] is True
        assert prometheus.asked[-1] == 'timestamp(DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1",pod!=""})'
        hostile = 'GPU-2"} or vector(1) or x{a="'
        with pytest.raises(PermanentError, match="is held by pods: none"):
            k.run(decision("reclaim", did="d2", node="gpu-2", uuid=hostile))
        assert prometheus.asked[-1] == (
            'timestamp(DCGM_FI_DEV_GPU_UTIL{UUID="GPU-2\\"} or vector(1) or x{a=\\"",pod!=""})'
        )
        with pytest.raises(PermanentError, match="runs on 'gpu-2', not on the target's node"):
            k.run(decision("reclaim", did="d3", node="gpu-1", uuid="GPU-1"))
        api.edit("", "pods", "train-6d4f-x", "ml", metadata={"labels": {names.VETO_LABEL: "true"}})
        standing = k.standing(decision("reclaim", did="d4", node="gpu-2", uuid="GPU-1"))
        assert standing.veto == "pod ml/train-6d4f-x is labelled gpuops.io/do-not-touch=true"
    finally:
        prometheus.close()


def test_a_stale_series_never_names_a_pod_to_evict(api: FakeApiServer, tmp_path: Path) -> None:
    """A GPU-level migrate (target node, uuid) asks a real Prometheus which pod holds the GPU:
    a series whose newest sample is older than the engine's bound (its exporter moved on, no
    staleness marker: Prometheus still answers it for 5 minutes) names no pod; the action
    waits, evicting nothing, and a fresh series names the pod evicted."""
    config = "global:\n  scrape_interval: 15s\nscrape_configs: []\n"
    remote = ["--web.enable-remote-write-receiver"]
    with PrometheusServer(tmp_path / "prometheus", config, extra_args=remote) as prometheus:
        writer = RemoteWriter(prometheus.url)

        def gpu_series(pod_name: str, age_s: float) -> None:
            at = time.time() - age_s
            labels = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("UUID", "GPU-1"))
            labels += (("namespace", "ml"), ("pod", pod_name), ("Hostname", "gpu-1"))
            writer.add(int(at * 1000), {labels: 90.0})
            writer.flush()

        gpu_series("serve-b", 120)  # the GPU's pod two minutes ago
        reclaim = {"prometheus_url": prometheus.url, "max_sample_age_s": 30}
        k = executor(api, tmp_path, reclaim=reclaim)
        gpu_fault = decision("migrate", node="gpu-1", uuid="GPU-1")
        with pytest.raises(TemporaryError) as waiting:
            k.run(gpu_fault)
        said = (
            "only in series older than reclaim.max_sample_age_s (30 s): 'ml/serve-b' last seen 12"
        )
        assert said in str(waiting.value), waiting.value
        assert not [r for r in api.requests if r.path.endswith("/eviction")]
        gpu_series("train-a", 1)  # now
        done = k.run(gpu_fault)
    assert done["evicted"] == ["ml/train-a"], done
    assert api.get("", "pods", "serve-b", "ml")  # the stale series' pod was never touched


def test_each_node_is_a_lane_of_its_own(api: FakeApiServer, tmp_path: Path) -> None:
    k = executor(api, tmp_path)
    assert k.lane(decision("migrate", node="gpu-1")) == "gpu-1"
    assert k.lane(decision("scale_out", pool="a100")) == ""


def test_a_scale_a_crash_interrupted_after_its_mark_is_finished_once(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The mark was written, the /scale PUT never came (a crash): the replayed decision makes
    it, once."""
    api.put("cluster.x-k8s.io", "machinedeployments", machinedeployment("gpu-a100", 2))
    api.edit(
        "cluster.x-k8s.io",
        "machinedeployments",
        "gpu-a100",
        "capi",
        metadata={
            "annotations": {
                names.SCALED_OUT: "1",
                names.PREVIOUS_REPLICAS: "2",
                names.REPLICAS: "3",
                names.DECISION: "o1",
            }
        },
    )
    k = executor(api, tmp_path)
    done = k.run(decision("scale_out", did="o1", pool="a100"))
    assert done == {"pool": "a100", "replicas": 3, "previous": 2, "scaled_out": 1, "already": True}
    again = k.run(decision("scale_out", did="o1", pool="a100"))
    assert again["replicas"] == 3
    md = api.get("cluster.x-k8s.io", "machinedeployments", "gpu-a100", "capi")
    assert md["spec"]["replicas"] == 3
    assert len([r for r in api.requests if r.method == "PUT"]) == 1


def test_a_reclaim_a_crash_interrupted_after_its_mark_is_finished(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("apps", "deployments", deployment("train", 3))
    api.edit(
        "apps",
        "deployments",
        "train",
        "ml",
        metadata={"annotations": {names.PREVIOUS_REPLICAS: "3", names.DECISION: "r1"}},
    )
    api.put("apps", "replicasets", replicaset("train-6d4f", "train"))
    api.put("", "pods", pod("train-6d4f-x", "gpu-2", owner=("ReplicaSet", "train-6d4f")))
    k = executor(api, tmp_path)
    done = k.run(decision("reclaim", did="r1", namespace="ml", pod="train-6d4f-x"))
    assert done["already"] is True and done["previous_replicas"] == 3
    assert api.get("apps", "deployments", "train", "ml")["spec"]["replicas"] == 0


def test_standing_counts_nodes_for_migrate_only_and_reads_the_pods_veto(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("", "nodes", node("gpu-3", ready=False))
    k = executor(api, tmp_path)
    reclaim = k.standing(
        decision("reclaim", node="gpu-1", uuid="GPU-1", namespace="ml", pod="train-a")
    )
    assert reclaim.unavailable is None and reclaim.population is None and reclaim.veto is None
    api.edit("", "pods", "train-a", "ml", metadata={"labels": {names.VETO_LABEL: "true"}})
    vetoed = k.standing(
        decision("reclaim", node="gpu-1", uuid="GPU-1", namespace="ml", pod="train-a")
    )
    assert vetoed.veto == "pod ml/train-a is labelled gpuops.io/do-not-touch=true"
    gone = k.standing(decision("reclaim", node="gpu-1", uuid="GPU-1", namespace="ml", pod="x"))
    assert gone.veto is None


def test_scale_out_above_the_maximum_never_scales_down_nor_scale_in_up(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A pool someone grew past gpuops' maximum keeps its replicas; a scale-in whose mark
    says gpuops added a negative count adds none."""
    api.put("cluster.x-k8s.io", "machinedeployments", machinedeployment("gpu-a100", 6))
    k = executor(api, tmp_path)
    out = k.run(decision("scale_out", did="o1", params={"nodes": 1}, pool="a100"))
    assert out["replicas"] == 6 and out["why"] == "at its maximum (4 replicas)"
    api.edit(
        "cluster.x-k8s.io",
        "machinedeployments",
        "gpu-a100",
        "capi",
        metadata={"annotations": {names.SCALED_OUT: "-2"}},
    )
    down = k.run(decision("scale_in", did="i1", params={"nodes": 1}, pool="a100"))
    assert down["replicas"] == 6
    md = api.get("cluster.x-k8s.io", "machinedeployments", "gpu-a100", "capi")
    assert md["spec"]["replicas"] == 6
    assert not [r for r in api.requests if r.method == "PUT"]


def test_a_busy_api_server_is_a_temporary_error_waiting_as_it_asks(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """429 from API Priority and Fairness: on a LIST, a temporary error with its Retry-After;
    inside a drain, waited for as it asks, not taken for a PodDisruptionBudget."""
    k = executor(api, tmp_path)
    api.throttle = 1
    with pytest.raises(TemporaryError, match=r"API server busy \(429\)") as busy:
        k.run(decision("migrate", node="gpu-1"))
    assert busy.value.delay == 1.0
    sleeps = Sleeps()
    k = executor(api, tmp_path, sleeps)

    def shed(method: str, path: str) -> None:
        if path.endswith("/eviction") and not shed.done:  # type: ignore[attr-defined]
            shed.done = True  # type: ignore[attr-defined]
            api.throttle = 1

    shed.done = False  # type: ignore[attr-defined]
    api.before = shed
    done = k.run(decision("migrate", did="m2", node="gpu-1"))
    assert sorted(done["evicted"]) == ["ml/serve-b", "ml/train-a"]
    assert sleeps.slept == [1.0] and done["budgets"] == []


def test_a_vetoed_pod_is_not_evicted_by_a_drain(api: FakeApiServer, tmp_path: Path) -> None:
    api.put(
        "", "pods", pod("keep", "gpu-1", labels={names.VETO_LABEL: names.VETO_VALUE, "app": "x"})
    )
    done = executor(api, tmp_path).run(decision("migrate", node="gpu-1"))
    assert "ml/keep (veto)" in done["skipped"]
    assert "ml/keep" not in done["evicted"]
    assert not api.get("", "pods", "keep", "ml")["metadata"].get("deletionTimestamp")


def test_an_admins_cordon_over_gpuops_marks_is_never_lifted(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """gpuops cordons; an admin uncordons then cordons again for maintenance (kubectl leaves
    gpuops' annotations): managedFields say the cordon is the admin's, so the undo removes
    gpuops' marks only."""
    k = executor(api, tmp_path)
    k.run(decision("migrate", node="gpu-1"))
    owners = [
        e["manager"]
        for e in _node(api)["metadata"]["managedFields"]
        if "f:unschedulable" in e["fieldsV1"].get("f:spec", {})
    ]
    assert owners == ["gpuops"]
    api.edit("", "nodes", "gpu-1", spec={"unschedulable": None})
    api.edit("", "nodes", "gpu-1", spec={"unschedulable": True})
    undo = k.run(decision("resume", did="u1", transition=Transition.CLEAR, node="gpu-1"))
    assert undo["uncordoned"] is False and "cordoned again by someone else" in undo["why"]
    n = _node(api)
    assert n["spec"]["unschedulable"] is True
    assert names.CORDONED_BY not in (n["metadata"].get("annotations") or {})
    again = k.run(decision("migrate", did="m2", episode=2000.0, node="gpu-1"))
    assert again["cordoned"] is False and "before gpuops" in again["why"]


def test_a_migrate_failing_after_its_cordon_leaks_no_cordon(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The drain fails after the cordon (the node's pods cannot be listed): the outcome says
    so and counts as acted, so the policy's resume lifts the cordon; a cordon left by an
    earlier episode is gpuops' still (its field manager owns it) and a later undo lifts it."""
    api.allowed = {("list", "", "nodes"), ("patch", "", "nodes"), ("patch", "", "nodes/status")}
    k = executor(api, tmp_path)
    done = k.run(decision("migrate", node="gpu-1"))
    assert done["cordoned"] is True and "the drain failed: RBAC" in done["why"]
    api.allowed = None
    later = k.run(
        decision("resume", did="u2", transition=Transition.CLEAR, episode=3000.0, node="gpu-1")
    )
    assert later == {"node": "gpu-1", "uncordoned": True}
    assert "unschedulable" not in _node(api)["spec"]


def test_a_taint_value_is_a_label_value_whatever_the_policy_name(
    api: FakeApiServer, tmp_path: Path
) -> None:
    k = executor(api, tmp_path, taint=True)
    done = k.run(decision("migrate", policy="gpu_fault." + "x" * 70 + "-", node="gpu-1"))
    assert done["cordoned"] is True
    (taint,) = _node(api)["spec"]["taints"]
    assert len(taint["value"]) <= 63 and taint["value"][-1].isalnum()


def test_reclaims_undo_gives_back_only_what_gpuops_took(api: FakeApiServer, tmp_path: Path) -> None:
    """restore_workload: the Deployment back to its replicas, the Job resumed, the Kueue
    Workload reactivated; a Deployment someone scaled since keeps their scale."""
    api.put("apps", "deployments", deployment("train", 3))
    api.put("apps", "replicasets", replicaset("train-6d4f", "train"))
    api.put("", "pods", pod("train-6d4f-x", "gpu-2", owner=("ReplicaSet", "train-6d4f")))
    api.put("batch", "jobs", {"kind": "Job", "metadata": {"name": "sweep", "namespace": "ml"}})
    api.put("", "pods", pod("sweep-1", "gpu-2", owner=("Job", "sweep")))
    k = executor(api, tmp_path)

    def act(verb: str, name: str, did: str) -> dict:  # type: ignore[type-arg]
        transition = Transition.FIRE if verb == "reclaim" else Transition.CLEAR
        d = decision(
            verb, did=did, policy="reclaim-idle", transition=transition, namespace="ml", pod=name
        )
        return dict(k.run(d))

    assert act("reclaim", "train-6d4f-x", "r1")["reclaimed"] is True
    assert act("reclaim", "sweep-1", "r2")["reclaimed"] is True
    back = act("restore_workload", "train-6d4f-x", "u1")
    assert back == {
        "pod": "ml/train-6d4f-x",
        "restored": True,
        "owner": "Deployment ml/train",
        "replicas": 3,
    }
    dep = api.get("apps", "deployments", "train", "ml")
    assert dep["spec"]["replicas"] == 3
    assert not any(a.startswith("gpuops.io/") for a in dep["metadata"].get("annotations") or {})
    assert act("restore_workload", "train-6d4f-x", "u1")["restored"] is False  # nothing twice
    assert act("restore_workload", "sweep-1", "u2")["restored"] is True
    assert api.get("batch", "jobs", "sweep", "ml")["spec"]["suspend"] is False
    act("reclaim", "train-6d4f-x", "r3")
    api.edit("apps", "deployments", "train", "ml", spec={"replicas": 5})  # someone scaled it
    left = act("restore_workload", "train-6d4f-x", "u3")
    assert left["restored"] is False and left["replicas"] == 5
    assert api.get("apps", "deployments", "train", "ml")["spec"]["replicas"] == 5


def test_a_kubeconfig_whose_exec_plugin_fails_is_reported_before_the_engine_starts(
    api: FakeApiServer, tmp_path: Path
) -> None:
    from gpuops.integrations.kubernetes.client import check_kubeconfig

    good = tmp_path / "good"
    good.write_text(api.kubeconfig(), encoding="utf-8")
    assert check_kubeconfig(str(good)) is None
    config = json.loads(api.kubeconfig())
    config["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "false"}
    }
    broken = tmp_path / "broken"
    broken.write_text(json.dumps(config), encoding="utf-8")
    assert "gives no credentials" in str(check_kubeconfig(str(broken)))


def _exec_kubeconfig(api: FakeApiServer, tmp: Path, plugin: str) -> Path:
    """A kubeconfig whose user's credentials come from the exec plugin ``plugin`` (sh)."""
    script = tmp / "plugin"
    script.write_text(f"#!/bin/sh\n{plugin}\n", encoding="utf-8")
    script.chmod(0o755)
    config = json.loads(api.kubeconfig())
    config["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script)}
    }
    path = tmp / "kubeconfig-exec"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is gone


def test_an_exec_plugin_that_hangs_is_killed_and_its_action_says_so(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The client runs a kubeconfig's exec plugin with no deadline: gpuops gives it
    ``exec_timeout_s``, then kills it and whatever it started, and the action fails
    temporarily saying so, instead of hanging the executor."""
    pids = tmp_path / "pids"
    hung = _exec_kubeconfig(api, tmp_path, f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait")
    k = KubernetesExecutor(settings(hung, exec_timeout_s=1))
    started = time.monotonic()
    with pytest.raises(TemporaryError) as failed:
        k.run(decision("migrate", node="gpu-1"))
    assert time.monotonic() - started < 10
    assert f"kubeconfig {hung}: its exec plugin gave no credentials: " in str(failed.value)
    assert "gave no credentials within 1 s (executors.kubernetes.exec_timeout_s): killed" in str(
        failed.value
    )
    plugin, child = (int(pid) for pid in pids.read_text().split())
    wait_for(lambda: not _alive(plugin) and not _alive(child), 5, "the plugin and its child gone")
    assert not _node(api)["spec"].get("unschedulable")  # nothing was done
    assert check_kubeconfig(str(hung), 1) == (
        f"kubeconfig {hung} gives no credentials (no token, no client certificate): its exec "
        "plugin failed: exec: process returned 124. exec plugin "
        f"'{tmp_path}/plugin' gave no credentials within 1 s "
        "(executors.kubernetes.exec_timeout_s): killed"
    )


def test_an_exec_plugin_that_answers_in_time_gives_the_token(
    api: FakeApiServer, tmp_path: Path
) -> None:
    credential = json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {"token": api.token},
        }
    )
    quick = _exec_kubeconfig(api, tmp_path, f"echo '{credential}'")
    done = KubernetesExecutor(settings(quick, exec_timeout_s=5)).run(
        decision("migrate", node="gpu-1")
    )
    assert done["cordoned"] is True and _node(api)["spec"]["unschedulable"] is True


def test_a_pod_recreated_under_its_name_is_neither_evicted_nor_deleted(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Evictions and deletes carry the pod's uid as a precondition: a StatefulSet pod
    recreated under the same name (a 409) is not this drain's to evict."""

    def recreate(method: str, path: str) -> None:
        if method == "POST" and path.endswith("/pods/train-a/eviction"):
            api.put("", "pods", pod("train-a", "gpu-2", labels={"app": "train"}))  # a new uid

    api.before = recreate
    done = executor(api, tmp_path).run(decision("migrate", node="gpu-1"))
    assert "ml/train-a (gone: recreated)" in done["skipped"]
    assert done["evicted"] == ["ml/serve-b"]
    assert not api.get("", "pods", "train-a", "ml")["metadata"].get("deletionTimestamp")


def test_standing_holds_a_node_migrate_when_the_nodes_cannot_be_read(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """max_fraction cannot count the nodes: the cordon waits (held as a veto saying why)."""
    k = executor(api, tmp_path)
    api.allowed = set()
    held = k.standing(decision("migrate", node="gpu-1"))
    assert held.veto is not None and "cannot be read now, so not cordoned" in held.veto


def test_the_outcome_names_the_budget_the_api_server_named(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A set-based PDB selector (``In``) holds the pod: the 429's cause names it."""
    budget = pdb("train-set", "train", allowed=0)
    budget["spec"]["selector"] = {
        "matchExpressions": [{"key": "app", "operator": "In", "values": ["train", "eval"]}]
    }
    api.put("policy", "poddisruptionbudgets", budget)
    done = executor(api, tmp_path, drain={"timeout_s": 5}).run(decision("migrate", node="gpu-1"))
    assert done["budgets"] == ["ml/train-set (disruptionsAllowed 0)"]
