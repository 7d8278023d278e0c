"""The mission on Kubernetes, end to end: series shaped as dcgm-exporter, kube-state-metrics and
Kueue write them (``tests.fakes.exposition``) → a real Prometheus (1 s scrapes) → the engine
running policies shaped as rules/kubernetes' (1 s evaluations, no ``for``) with ``scheduler``
mapped to the ``kubernetes`` executor → the fake API server (``tests.fakes.kube_apiserver``),
through the official client.

An idle GPU's Deployment is scaled to zero; a NotReady node is cordoned and drained, a
PodDisruptionBudget holding one pod until the drain's deadline (the outcome names it); a Kueue
queue adds a node to its pool's MachineDeployment. Prints fault → cordon and cordon → last
eviction (``pytest -s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from gpuops.integrations.kubernetes import names
from gpuops.model.decisions import Decision, Outcome
from gpuops.runtime import Engine
from gpuops.settings import PrometheusSettings
from gpuops.sources.promproc import PrometheusServer
from tests.builders import build_engine
from tests.fakes.exposition import Exporter
from tests.fakes.kube_apiserver import FakeApiServer
from tests.integration.actions.kube import deployment, machinedeployment, node, pdb, pod, replicaset
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

RULES = """
groups:
  - name: kubernetes
    interval: 1s
    rules:
      - policy: reclaim-idle-gpu-deployments
        expr: DCGM_FI_DEV_GPU_UTIL{pod!=""} < 20
        target: [namespace, pod]
        action: {type: reclaim, executor: scheduler}
        mode: enforce
      - policy: scale-out-on-kueue-queue
        expr: |
          label_replace(
            sum by (cluster_queue) (kueue_pending_workloads{status="active"}),
            "pool", "$1", "cluster_queue", "(.+)"
          ) > 0
        target: [pool]
        action: {type: scale_out, executor: scheduler, params: {nodes: 1}}
        mode: enforce
      - policy: migrate-off-not-ready-gpu-nodes
        expr: |
          kube_node_status_condition{condition="Ready",status="true"} == 0
            and on (node) kube_node_status_capacity{resource="nvidia_com_gpu"} > 0
        target: [node]
        action: {type: migrate, executor: scheduler}
        on_clear: {type: resume, executor: scheduler}
        limits:
          max_fraction: 0.5
          population: 'kube_node_status_capacity{resource="nvidia_com_gpu"} > 0'
        mode: enforce
"""

NODES = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")


@dataclass
class Story:
    api: FakeApiServer
    exporter: Exporter
    engine: Engine
    outcomes: list[tuple[Decision, Outcome]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, decision: Decision, outcome: Outcome | None) -> None:
        if outcome is not None:
            with self.lock:
                self.outcomes.append((decision, outcome))

    def outcome(self, policy: str) -> Outcome | None:
        with self.lock:
            found = [o for d, o in self.outcomes if d.policy == policy]
        return found[-1] if found else None


@pytest.fixture
def story(tmp_path: Path) -> Iterator[Story]:
    api = FakeApiServer()
    exporter = Exporter()
    for name in NODES:
        api.put("", "nodes", node(name))
        exporter.set(
            "kube_node_status_capacity",
            {"node": name, "resource": "nvidia_com_gpu", "unit": "integer"},
            8,
        )
        exporter.set(
            "kube_node_status_condition", {"node": name, "condition": "Ready", "status": "true"}, 1
        )
    api.put("apps", "deployments", deployment("notebook", 1))
    api.put("apps", "replicasets", replicaset("notebook-7c9", "notebook"))
    api.put("", "pods", pod("notebook-7c9-x", "gpu-2", owner=("ReplicaSet", "notebook-7c9")))
    api.put("", "pods", pod("serve-0", "gpu-1", labels={"app": "serve"}))
    api.put("", "pods", pod("train-0", "gpu-1", labels={"app": "train"}))
    api.put("", "pods", pod("train-1", "gpu-1", labels={"app": "train"}))
    api.put(
        "",
        "pods",
        pod(
            "dcgm-exporter-a",
            "gpu-1",
            namespace="gpu-operator",
            owner=("DaemonSet", "dcgm-exporter"),
        ),
    )
    api.put("policy", "poddisruptionbudgets", pdb("serve", "serve", allowed=0))
    api.put("cluster.x-k8s.io", "machinedeployments", machinedeployment("gpu-a100", 2))
    for gpu, (namespace, name, util) in {
        "GPU-1": ("ml", "notebook-7c9-x", 85.0),
        "GPU-2": ("ml", "train-0", 97.0),
    }.items():
        exporter.set(
            "DCGM_FI_DEV_GPU_UTIL",
            {"UUID": gpu, "gpu": "0", "Hostname": "x", "namespace": namespace, "pod": name},
            util,
        )
    exporter.set("kueue_pending_workloads", {"cluster_queue": "a100", "status": "active"}, 0)
    config = tmp_path / "kubeconfig"
    config.write_text(api.kubeconfig(), encoding="utf-8")
    prom = PrometheusServer(
        tmp_path / "prometheus",
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: cluster\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['{exporter.address}']}}]\n",
    )
    prom.start()
    engine: Engine | None = None
    try:
        s = Story(api, exporter, None)  # type: ignore[arg-type]
        engine = build_engine(
            tmp_path,
            RULES,
            prometheus=PrometheusSettings(url=prom.url, timeout=2.0),
            executor_settings={
                "scheduler": {"use": "kubernetes"},
                "kubernetes": {
                    "kubeconfig": str(config),
                    "node_selector": "nvidia.com/gpu.present=true",
                    "qps": 50,
                    "burst": 50,
                    "drain": {"timeout_s": 3, "backoff_s": 0.5, "max_backoff_s": 1},
                    "pools": {"a100": {"namespace": "capi", "name": "gpu-a100", "max_replicas": 3}},
                },
            },
            listener=s.record,
            reload=False,
        )
        s.engine = engine
        wait_for(
            lambda: requests.get(
                f"{prom.url}/api/v1/query",
                params={"query": "count(kube_node_status_condition)"},
                timeout=5,
            ).json()["data"]["result"],
            30,
            "Prometheus to scrape the cluster's series",
        )
        engine.start()
        yield s
    finally:
        if engine is not None:
            engine.stop()
        prom.stop()
        exporter.close()
        api.close()


def test_idle_gpu_node_fault_and_queue_on_kubernetes(story: Story) -> None:
    api, exporter = story.api, story.exporter

    # an idle GPU: its Deployment goes to zero through /scale, its replicas kept for the undo
    exporter.set(
        "DCGM_FI_DEV_GPU_UTIL",
        {"UUID": "GPU-1", "gpu": "0", "Hostname": "x", "namespace": "ml", "pod": "notebook-7c9-x"},
        3.0,
    )
    wait_for(
        lambda: api.get("apps", "deployments", "notebook", "ml")["spec"]["replicas"] == 0,
        30,
        "the idle notebook's Deployment scaled to zero",
    )
    notebook = api.get("apps", "deployments", "notebook", "ml")
    assert notebook["metadata"]["annotations"][names.PREVIOUS_REPLICAS] == "1"

    # a node fault: cordoned with ownership, drained by eviction, a PDB holding serve-0
    fault = time.monotonic()
    exporter.set(
        "kube_node_status_condition", {"node": "gpu-1", "condition": "Ready", "status": "true"}, 0
    )
    wait_for(
        lambda: story.outcome("migrate-off-not-ready-gpu-nodes"),
        40,
        "the NotReady node's migrate outcome",
    )
    outcome = story.outcome("migrate-off-not-ready-gpu-nodes")
    assert outcome is not None and outcome.status.value == "success"
    assert outcome.changed["held"] == [
        "ml/serve-0: Cannot evict pod as it would violate the pod's disruption budget. "
        "(The disruption budget serve needs 1 healthy pods and has 1 currently)"
    ]
    assert outcome.changed["budgets"] == ["ml/serve (disruptionsAllowed 0)"]
    gpu1 = api.get("", "nodes", "gpu-1")
    assert gpu1["spec"]["unschedulable"] is True
    assert gpu1["metadata"]["annotations"][names.CORDONED_BY] == "migrate-off-not-ready-gpu-nodes"
    for evicted in ("train-0", "train-1"):
        assert api.get("", "pods", evicted, "ml")["metadata"].get("deletionTimestamp")
    assert not api.get("", "pods", "serve-0", "ml")["metadata"].get("deletionTimestamp")
    assert not api.get("", "pods", "dcgm-exporter-a", "gpu-operator")["metadata"].get(
        "deletionTimestamp"
    )
    cordon = next(
        r.at for r in api.requests if r.method == "PATCH" and r.path == "/api/v1/nodes/gpu-1"
    )
    evictions = [r.at for r in api.requests if r.path.endswith("/eviction") and r.status == 201]
    print(
        f"\nfault -> cordon {cordon - fault:.2f} s; cordon -> last eviction "
        f"{max(evictions) - cordon:.2f} s ({len(evictions)} evictions); the drain ended at its "
        f"deadline, the migrate taking {outcome.duration_s:.2f} s"
    )

    # a queue: the pool's MachineDeployment gets a node, and never more than its maximum
    exporter.set("kueue_pending_workloads", {"cluster_queue": "a100", "status": "active"}, 14)
    wait_for(
        lambda: (
            api.get("cluster.x-k8s.io", "machinedeployments", "gpu-a100", "capi")["spec"][
                "replicas"
            ]
            == 3
        ),
        30,
        "the a100 pool scaled out",
    )
    md = api.get("cluster.x-k8s.io", "machinedeployments", "gpu-a100", "capi")
    assert md["metadata"]["annotations"][names.SCALED_OUT] == "1"

    # the node is Ready again: gpuops uncordons what it cordoned
    exporter.set(
        "kube_node_status_condition", {"node": "gpu-1", "condition": "Ready", "status": "true"}, 1
    )
    wait_for(
        lambda: not api.get("", "nodes", "gpu-1")["spec"].get("unschedulable"),
        30,
        "gpu-1 uncordoned by the undo",
    )
