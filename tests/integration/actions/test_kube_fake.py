"""The fake API server's own wire contract (tests/fakes/kube_apiserver.py), over raw HTTP: what
the executor's tests rely on it to answer as kube-apiserver does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.fakes.kube_apiserver import FakeApiServer
from tests.integration.actions.kube import deployment, machinedeployment, node, pdb, pod

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.put("", "nodes", node("gpu-1", zone="a"))
    server.put("", "nodes", node("gpu-2", zone="b"))
    yield server
    server.close()


def call(
    api: FakeApiServer,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    token: str | None = None,
) -> requests.Response:
    headers = {"Authorization": f"Bearer {token or api.token}", "Content-Type": content_type}
    return requests.request(method, api.url + path, json=body, headers=headers, timeout=5)


def test_selectors_equality_and_set_based(api: FakeApiServer) -> None:
    def names(selector: str) -> list[str]:
        answer = call(api, "GET", f"/api/v1/nodes?labelSelector={selector}").json()
        return [n["metadata"]["name"] for n in answer["items"]]

    assert names("zone=a") == ["gpu-1"]
    assert names("zone!=a") == ["gpu-2"]
    assert names("zone in (a,b)") == ["gpu-1", "gpu-2"]
    assert names("zone notin (a)") == ["gpu-2"]
    assert names("!zone") == [] and names("zone") == ["gpu-1", "gpu-2"]
    bad = call(api, "GET", "/api/v1/nodes?labelSelector=a%20b")
    assert bad.status_code == 400 and bad.json()["kind"] == "Status"


def test_a_stale_resource_version_is_a_409_conflict_status(api: FakeApiServer) -> None:
    rv = api.get("", "nodes", "gpu-1")["metadata"]["resourceVersion"]
    ok = call(
        api,
        "PATCH",
        "/api/v1/nodes/gpu-1",
        {"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": True}},
        MERGE,
    )
    assert ok.status_code == 200 and ok.json()["metadata"]["resourceVersion"] != rv
    stale = call(api, "PATCH", "/api/v1/nodes/gpu-1", {"metadata": {"resourceVersion": rv}}, MERGE)
    assert stale.status_code == 409
    assert stale.json()["reason"] == "Conflict" and stale.json()["code"] == 409


def test_strategic_merge_patch_merges_conditions_by_type_and_is_415_on_custom_resources(
    api: FakeApiServer,
) -> None:
    patch = {"status": {"conditions": [{"type": "GpuopsCordoned", "status": "True"}]}}
    answer = call(api, "PATCH", "/api/v1/nodes/gpu-1/status", patch, STRATEGIC).json()
    assert [c["type"] for c in answer["status"]["conditions"]] == ["Ready", "GpuopsCordoned"]
    merge = call(api, "PATCH", "/api/v1/nodes/gpu-1/status", patch, MERGE).json()
    assert [c["type"] for c in merge["status"]["conditions"]] == ["GpuopsCordoned"]
    api.put("cluster.x-k8s.io", "machinedeployments", machinedeployment("md", 1))
    crd = call(
        api,
        "PATCH",
        "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi/machinedeployments/md",
        {"spec": {"replicas": 2}},
        STRATEGIC,
    )
    assert crd.status_code == 415 and crd.json()["reason"] == "UnsupportedMediaType"


def test_eviction_honours_one_pdb_and_refuses_two(api: FakeApiServer) -> None:
    api.put("", "pods", pod("a", "gpu-1", labels={"app": "x"}))
    api.put("policy", "poddisruptionbudgets", pdb("one", "x", allowed=1))
    evict = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "a", "namespace": "ml"},
    }
    assert call(api, "POST", "/api/v1/namespaces/ml/pods/a/eviction", evict).status_code == 201
    assert (
        api.get("policy", "poddisruptionbudgets", "one", "ml")["status"]["disruptionsAllowed"] == 0
    )
    api.put("", "pods", pod("b", "gpu-1", labels={"app": "x"}))
    held = call(
        api,
        "POST",
        "/api/v1/namespaces/ml/pods/b/eviction",
        evict | {"metadata": {"name": "b", "namespace": "ml"}},
    )
    assert held.status_code == 429 and "Retry-After" not in held.headers
    assert held.json()["details"]["causes"][0]["reason"] == "DisruptionBudget"
    api.put("policy", "poddisruptionbudgets", pdb("two", "x", allowed=1))
    two = call(
        api,
        "POST",
        "/api/v1/namespaces/ml/pods/b/eviction",
        evict | {"metadata": {"name": "b", "namespace": "ml"}},
    )
    assert two.status_code == 500 and "more than one PodDisruptionBudget" in two.json()["message"]


def test_scale_subresource_and_its_validation(api: FakeApiServer) -> None:
    api.put("apps", "deployments", deployment("d", 3))
    path = "/apis/apps/v1/namespaces/ml/deployments/d/scale"
    scale = call(api, "GET", path).json()
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 3}
    scale["spec"]["replicas"] = -1
    assert call(api, "PUT", path, scale).status_code == 422
    scale["spec"]["replicas"] = 1
    assert call(api, "PUT", path, scale).json()["spec"] == {"replicas": 1}
    assert call(api, "PUT", path, scale).status_code == 409  # its resourceVersion is stale now


def test_no_token_401_and_rbac_403_as_the_api_server_words_them(api: FakeApiServer) -> None:
    assert call(api, "GET", "/api/v1/nodes", token="wrong").status_code == 401
    api.allowed = {("list", "", "nodes")}
    assert call(api, "GET", "/api/v1/nodes").status_code == 200
    refused = call(api, "PATCH", "/api/v1/nodes/gpu-1", {}, MERGE).json()
    assert refused["code"] == 403 and refused["message"] == (
        'nodes "gpu-1" is forbidden: User "system:serviceaccount:gpuops:gpuops" cannot patch '
        'resource "nodes" in API group "" at the cluster scope'
    )


def test_an_encoded_slash_stays_in_its_name(api: FakeApiServer) -> None:
    answer = call(api, "GET", "/api/v1/nodes/gpu-1%2F..%2Fgpu-2")
    assert answer.status_code == 404 and answer.json()["details"]["name"] == "gpu-1/../gpu-2"


def test_taints_are_replaced_whole_even_by_a_strategic_merge_patch(api: FakeApiServer) -> None:
    """``spec.taints`` has no patch merge key: a strategic merge patch replaces the list."""
    first = {"spec": {"taints": [{"key": "a", "value": "1", "effect": "NoSchedule"}]}}
    call(api, "PATCH", "/api/v1/nodes/gpu-1", first, STRATEGIC)
    second = {"spec": {"taints": [{"key": "b", "value": "2", "effect": "NoSchedule"}]}}
    answer = call(api, "PATCH", "/api/v1/nodes/gpu-1", second, STRATEGIC).json()
    assert [t["key"] for t in answer["spec"]["taints"]] == ["b"]


def test_discovery_lists_the_served_versions_and_others_are_404(api: FakeApiServer) -> None:
    groups = {g["name"]: g for g in call(api, "GET", "/apis").json()["groups"]}
    assert groups["kueue.x-k8s.io"]["preferredVersion"]["version"] == "v1beta2"
    served = call(api, "GET", "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads")
    assert served.status_code == 200
    for gone in ("v1beta1", "v0nonsense"):
        path = f"/apis/kueue.x-k8s.io/{gone}/namespaces/ml/workloads"
        assert call(api, "GET", path).status_code == 404
    api.serves_only = {"", "apps"}
    assert "kueue.x-k8s.io" not in {g["name"] for g in call(api, "GET", "/apis").json()["groups"]}


def test_a_pod_not_running_is_evicted_whatever_its_budgets(api: FakeApiServer) -> None:
    """``canIgnorePDB`` comes before the budgets are counted: a Pending pod with two PDBs goes."""
    api.put("", "pods", pod("p", "gpu-1", labels={"app": "x"}, phase="Pending"))
    api.put("policy", "poddisruptionbudgets", pdb("one", "x", allowed=0))
    api.put("policy", "poddisruptionbudgets", pdb("two", "x", allowed=0))
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}}
    assert call(api, "POST", "/api/v1/namespaces/ml/pods/p/eviction", evict).status_code == 201
    assert api.get("", "pods", "p", "ml")["metadata"]["deletionTimestamp"]


def test_a_label_or_taint_value_that_is_no_label_value_is_422(api: FakeApiServer) -> None:
    taint = {"spec": {"taints": [{"key": "k", "value": "ends-", "effect": "NoSchedule"}]}}
    bad = call(api, "PATCH", "/api/v1/nodes/gpu-1", taint, MERGE)
    assert bad.status_code == 422 and "spec.taints[0].value" in bad.json()["message"]
    long = {"metadata": {"labels": {"k": "x" * 64}}}
    assert call(api, "PATCH", "/api/v1/nodes/gpu-1", long, MERGE).status_code == 422
    assert "taints" not in api.get("", "nodes", "gpu-1")["spec"]


def test_managed_fields_follow_the_field_manager_that_changed_each_field(
    api: FakeApiServer,
) -> None:
    def owner() -> list[str]:
        fields = api.get("", "nodes", "gpu-1")["metadata"].get("managedFields") or []
        return [
            e["manager"] for e in fields if "f:unschedulable" in e["fieldsV1"].get("f:spec", {})
        ]

    cordon = {"spec": {"unschedulable": True}}
    call(api, "PATCH", "/api/v1/nodes/gpu-1?fieldManager=gpuops", cordon, MERGE)
    assert owner() == ["gpuops"]
    call(api, "PATCH", "/api/v1/nodes/gpu-1?fieldManager=kubectl", cordon, MERGE)
    assert owner() == ["gpuops"]  # unchanged: not taken
    call(api, "PATCH", "/api/v1/nodes/gpu-1", {"spec": {"unschedulable": None}}, MERGE)
    assert owner() == []
    call(api, "PATCH", "/api/v1/nodes/gpu-1?fieldManager=kubectl", cordon, MERGE)
    assert owner() == ["kubectl"]


def test_a_budget_not_yet_observed_is_429_with_retry_after(api: FakeApiServer) -> None:
    api.put("", "pods", pod("a", "gpu-1", labels={"app": "x"}))
    budget = pdb("one", "x", allowed=1)
    budget["metadata"]["generation"] = 2
    budget["status"]["observedGeneration"] = 1
    api.put("policy", "poddisruptionbudgets", budget)
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a"}}
    held = call(api, "POST", "/api/v1/namespaces/ml/pods/a/eviction", evict)
    assert held.status_code == 429 and held.headers["Retry-After"] == "10"
    assert "still being processed" in held.json()["details"]["causes"][0]["message"]
    other = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a"}}
    other["deleteOptions"] = {"preconditions": {"uid": "not-its-uid"}}
    api.edit("policy", "poddisruptionbudgets", "one", "ml", status={"observedGeneration": 2})
    stale = call(api, "POST", "/api/v1/namespaces/ml/pods/a/eviction", other)
    assert stale.status_code == 409 and "Precondition failed" in stale.json()["message"]


def test_an_unready_pod_goes_when_its_budget_is_met_and_is_marked_disrupted(
    api: FakeApiServer,
) -> None:
    unready = pod("u", "gpu-1", labels={"app": "x"})
    unready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    api.put("", "pods", unready)
    api.put("policy", "poddisruptionbudgets", pdb("one", "x", allowed=0))
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "u"}}
    assert call(api, "POST", "/api/v1/namespaces/ml/pods/u/eviction", evict).status_code == 201
    gone = api.get("", "pods", "u", "ml")
    assert [c["type"] for c in gone["status"]["conditions"]] == ["Ready", "DisruptionTarget"]
    assert (
        api.get("policy", "poddisruptionbudgets", "one", "ml")["status"]["disruptionsAllowed"] == 0
    )
    api.put("", "pods", pod("r", "gpu-1", labels={"app": "x"}))  # ready: held
    ready = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "r"}}
    assert call(api, "POST", "/api/v1/namespaces/ml/pods/r/eviction", ready).status_code == 429
