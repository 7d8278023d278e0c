"""A small cluster in the fake API server (``tests.fakes.kube_apiserver``) and the decisions the
``kubernetes`` executor tests hand it (not a test module)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuops.actions.kubernetes import KubernetesExecutor
from gpuops.model.decisions import ActionSpec, Decision, Evidence, Target, Transition
from tests.fakes.kube_apiserver import FakeApiServer

SELECTOR = "nvidia.com/gpu.present=true"


def node(name: str, ready: bool = True, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", **labels}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(
    name: str,
    on: str,
    namespace: str = "ml",
    owner: tuple[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": on, "containers": [{"name": "main", "image": "train:1"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
        },
    }


def pdb(name: str, app: str, allowed: int, namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": allowed, "desiredHealthy": 1, "currentHealthy": 1},
    }


def deployment(name: str, replicas: int, namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
    }


def replicaset(name: str, deployment: str, namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": deployment,
                    "uid": f"uid-{deployment}",
                    "controller": True,
                }
            ],
        },
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": deployment}}},
    }


def machinedeployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "capi"},
        "spec": {"clusterName": "gpu", "replicas": replicas},
    }


def settings(kubeconfig: Path, **more: Any) -> dict[str, Any]:
    return {
        "kubeconfig": str(kubeconfig),
        "node_selector": SELECTOR,
        "drain": {"timeout_s": 300},
        "qps": 1000,
        "burst": 100,
        "pools": {
            "a100": {"namespace": "capi", "name": "gpu-a100", "max_replicas": 4},
        },
        **more,
    }


class Sleeps:
    """An injected clock the executor's sleeps advance."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def executor(
    server: FakeApiServer, tmp: Path, sleeps: Sleeps | None = None, **more: Any
) -> KubernetesExecutor:
    config = tmp / "kubeconfig"
    config.write_text(server.kubeconfig(), encoding="utf-8")
    s = sleeps or Sleeps()
    return KubernetesExecutor(settings(config, **more), sleep=s.sleep, clock=s.clock)


def decision(
    verb: str,
    did: str = "0123456789abcdef01234567",
    policy: str = "migrate-off-down-nodes",
    transition: Transition = Transition.FIRE,
    params: Mapping[str, Any] | None = None,
    episode: float = 1000.0,
    **labels: str,
) -> Decision:
    return Decision(
        id=did,
        policy=policy,
        group="capacity",
        target=Target.from_labels(labels, None),
        transition=transition,
        action=ActionSpec(verb, "kubernetes", dict(params or {})),
        evidence=Evidence('up{job="gpu-nodes"} == 0', 0.0, 0.0, 30.0),
        at=episode + 30.0,
        episode_start=episode,
        annotations={"summary": "node down"},
    )
