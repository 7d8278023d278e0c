"""Pods and their owners, for the ``kubernetes`` executor (``gpuops.actions.kubernetes``): which
pods hold a GPU (``pods_of_gpu``), and ``reclaim``: the owner chain pod → ReplicaSet →
Deployment, or StatefulSet, scaled to zero through ``/scale`` (the replicas before in
``gpuops.io/previous-replicas``); a Job suspended (``spec.suspend``); Kueue-managed work
deactivated on its Workload (``spec.active=false``, never ``suspend``: Kueue owns it); a pod
without owner left alone unless ``reclaim.bare_pods: delete``.

A GPU names its pods by the target's ``namespace`` and ``pod`` labels (dcgm-exporter's, or gpuops'
NVML exporter's pod attribution), or, when the target has only ``node`` and ``uuid``, by the
series ``reclaim.gpu_series`` in Prometheus, asked at the moment of acting. Either way a pod
that does not run on the target's node is refused: a label cannot name a pod elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import requests

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.encoding import printable
from gpuops.actions.results import Result
from gpuops.integrations.kubernetes import names
from gpuops.integrations.kubernetes.client import (
    CONFLICT_RETRIES,
    KubeClient,
    KubeConflict,
    KubeNotFound,
    check_name,
)
from gpuops.integrations.kubernetes.selectors import Selector
from gpuops.model.decisions import Decision

log = logging.getLogger(__name__)

KUEUE = ("kueue.x-k8s.io", "v1beta1", "workloads")
OWNERS: Mapping[str, tuple[str, str, str]] = {
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "Job": ("batch", "v1", "jobs"),
}


class Reclaimed(Result):
    pod: str
    reclaimed: bool
    owner: str | None = None
    """What was scaled, suspended or deactivated (``Deployment ml/train``)."""
    previous_replicas: int | None = None
    why: str | None = None
    already: bool | None = None


def pods_of_gpu(
    client: KubeClient,
    target: Mapping[str, str],
    node: str,
    prometheus_url: str | None,
    series: str,
    uuid_label: str,
    timeout_s: float,
    known: Mapping[tuple[str, str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The pods holding the target's GPU, each read (``known``: those already read) and checked
    to run on ``node``."""
    if "pod" in target and not target["pod"]:
        return []  # the target names no pod: a free GPU
    if target.get("pod") and target.get("namespace"):
        found = [(target["namespace"], target["pod"])]
    elif prometheus_url and target.get("uuid"):
        found = _ask_prometheus(prometheus_url, series, uuid_label, target["uuid"], timeout_s)
    else:
        raise PermanentError(
            "no pod named: the target needs the labels 'namespace' and 'pod' (dcgm-exporter's), "
            "or 'uuid' with executors.kubernetes.reclaim.prometheus_url set"
        )
    pods = []
    for namespace, name in found:
        check_name("namespace", namespace)
        check_name("pod", name)
        pod = (known or {}).get((namespace, name)) or client.pod(namespace, name)
        where = (pod.get("spec") or {}).get("nodeName")
        if where != node:
            raise PermanentError(
                f"pod {printable(namespace)}/{printable(name)} runs on {where!r}, not on the "
                f"target's node {node!r}: not acted on"
            )
        pods.append(pod)
    return pods


def _ask_prometheus(
    url: str, series: str, uuid_label: str, uuid: str, timeout_s: float
) -> list[tuple[str, str]]:
    value = uuid.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    expr = f'{series}{{{uuid_label}="{value}",pod!=""}}'
    try:
        resp = requests.get(
            f"{url.rstrip('/')}/api/v1/query", params={"query": expr}, timeout=timeout_s
        )
        resp.raise_for_status()
        result = resp.json()["data"]["result"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        raise TemporaryError(f"Prometheus {url}: cannot ask which pod holds {uuid}: {exc}") from exc
    return sorted(
        {(str(r["metric"].get("namespace", "")), str(r["metric"]["pod"])) for r in result}
    )


def reclaim(
    client: KubeClient, d: Decision, pod: Mapping[str, Any], veto: Selector, bare: str
) -> Reclaimed:
    """Reclaim the GPU of ``pod`` (as read) through its owner (module docstring)."""
    namespace, pod_name = str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])
    key = f"{namespace}/{pod_name}"
    if veto.matches(pod["metadata"].get("labels") or {}):
        raise PermanentError(f"pod {key} carries the veto label")
    owner = _controller(pod)
    if owner is None:
        if bare == "delete":
            client.delete_pod(namespace, pod_name)
            return Reclaimed(pod=key, reclaimed=True, why="a pod without owner: deleted")
        return Reclaimed(pod=key, reclaimed=False, why="a pod without owner: left alone")
    kind, name = owner
    if kind == "ReplicaSet":
        rs = client.get(*OWNERS["ReplicaSet"], namespace, name)
        up = _controller(rs)
        if up is None or up[0] != "Deployment":
            return Reclaimed(pod=key, reclaimed=False, why=f"ReplicaSet {name} has no Deployment")
        kind, name = up
    if kind not in OWNERS:
        return Reclaimed(pod=key, reclaimed=False, why=f"owned by a {kind}: left alone")
    obj = client.get(*OWNERS[kind], namespace, name)
    if veto.matches(obj["metadata"].get("labels") or {}):
        raise PermanentError(f"{kind} {namespace}/{name} carries the veto label")
    what = f"{kind} {namespace}/{name}"
    if kind == "Job":
        return _job(client, d, obj, key, what)
    return _to_zero(client, d, kind, obj, key, what)


def _to_zero(
    client: KubeClient, d: Decision, kind: str, obj: Any, key: str, what: str
) -> Reclaimed:
    """Scale ``obj`` (as read; read again after a conflict) to zero through ``/scale``."""
    where = (*OWNERS[kind], obj["metadata"]["namespace"], obj["metadata"]["name"])
    for attempt in range(CONFLICT_RETRIES):
        if attempt:
            obj = client.get(*where)
        annotations = obj["metadata"].get("annotations") or {}
        scale = client.scale(*where)
        replicas = int(scale["spec"].get("replicas") or 0)
        if annotations.get(names.DECISION) == d.id:  # ran before: finished if it was not
            previous = int(annotations.get(names.PREVIOUS_REPLICAS) or 0)
            if replicas == previous != 0:  # a crash came between the mark and the scale
                scale["spec"]["replicas"] = 0
                client.replace_scale(*where, scale)
            return Reclaimed(
                pod=key, reclaimed=True, owner=what, previous_replicas=previous, already=True
            )
        if replicas == 0:
            return Reclaimed(pod=key, reclaimed=False, owner=what, why="already at zero")
        patch = {
            "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "annotations": {
                    names.PREVIOUS_REPLICAS: str(replicas),
                    names.RECLAIMED_BY: d.policy,
                    names.DECISION: d.id,
                    names.AT: _now(),
                },
            }
        }
        try:
            marked = client.patch(*where, patch)
            scale["metadata"]["resourceVersion"] = marked["metadata"]["resourceVersion"]
            scale["spec"]["replicas"] = 0
            client.replace_scale(*where, scale)
        except KubeConflict:
            continue
        return Reclaimed(pod=key, reclaimed=True, owner=what, previous_replicas=replicas)
    raise KubeConflict(f"{what} kept changing")


def _job(client: KubeClient, d: Decision, job: dict[str, Any], key: str, what: str) -> Reclaimed:
    namespace, uid = job["metadata"]["namespace"], job["metadata"].get("uid")
    stamp = {names.RECLAIMED_BY: d.policy, names.DECISION: d.id, names.AT: _now()}
    try:
        workloads = client.list_objects(*KUEUE, namespace)
    except KubeNotFound:  # Kueue is not installed: no Workload manages the Job
        workloads = []
    for workload in workloads:
        if any(o.get("uid") == uid for o in workload["metadata"].get("ownerReferences") or []):
            wname = workload["metadata"]["name"]
            if (workload.get("spec") or {}).get("active") is False:
                return Reclaimed(
                    pod=key, reclaimed=True, owner=f"Workload {namespace}/{wname}", already=True
                )
            client.patch(
                *KUEUE,
                namespace,
                wname,
                {
                    "metadata": {
                        "resourceVersion": workload["metadata"]["resourceVersion"],
                        "annotations": stamp,
                    },
                    "spec": {"active": False},
                },
            )
            return Reclaimed(pod=key, reclaimed=True, owner=f"Workload {namespace}/{wname}")
    if (job.get("spec") or {}).get("suspend") is True:
        return Reclaimed(pod=key, reclaimed=True, owner=what, already=True)
    client.patch(
        *OWNERS["Job"],
        namespace,
        job["metadata"]["name"],
        {
            "metadata": {
                "resourceVersion": job["metadata"]["resourceVersion"],
                "annotations": stamp,
            },
            "spec": {"suspend": True},
        },
    )
    return Reclaimed(pod=key, reclaimed=True, owner=what)


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
