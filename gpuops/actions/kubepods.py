"""Pods and their owners, for the ``kubernetes`` executor (``gpuops.actions.kubernetes``): which
pods hold a GPU (``pods_of_gpu``), and ``reclaim``: the owner chain pod → ReplicaSet →
Deployment, or StatefulSet, scaled to zero through ``/scale`` (the replicas before in
``gpuops.io/previous-replicas``); a Job suspended (``spec.suspend``); Kueue-managed work
deactivated on its Workload (``spec.active=false``, never ``suspend``: Kueue owns it); a pod
without owner left alone unless ``reclaim.bare_pods: delete``.

A GPU names its pods by the target's ``namespace`` and ``pod`` labels (dcgm-exporter's, or gpuops'
NVML exporter's pod attribution), or, when the target has only ``node`` and ``uuid``, by the
series ``reclaim.gpu_series`` in Prometheus, asked at the moment of acting: only a series with a
sample newer than ``reclaim.max_sample_age_s`` names a pod (fresh data only: Prometheus answers
an instant query with a series' last sample for 5 minutes, so a pod gone or moved would still
be named). Either way a pod that does not run on the target's node is refused: a label cannot
name a pod elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.encoding import printable
from gpuops.actions.promlookup import series_ages, too_old
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

KUEUE_GROUP = "kueue.x-k8s.io"
WORKLOADS = "workloads"
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
    max_age_s: float,
    known: Mapping[tuple[str, str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The pods holding the target's GPU, each read (``known``: those already read) and checked
    to run on ``node``; asked of Prometheus, only those of a series whose newest sample is at
    most ``max_age_s`` old."""
    if "pod" in target and not target["pod"]:
        return []  # the target names no pod: a free GPU
    if target.get("pod") and target.get("namespace"):
        found = [(target["namespace"], target["pod"])]
    elif prometheus_url and target.get("uuid"):
        found = _ask_prometheus(
            prometheus_url, series, uuid_label, target["uuid"], timeout_s, max_age_s
        )
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
    url: str, series: str, uuid_label: str, uuid: str, timeout_s: float, max_age_s: float
) -> list[tuple[str, str]]:
    """(namespace, pod) of each series of ``series`` for GPU ``uuid`` whose newest sample is at
    most ``max_age_s`` old (``gpuops.actions.promlookup``). When every series naming a pod is
    older, nothing is named and the action waits (``TemporaryError``): a GPU whose pod
    attribution went stale is not a free GPU."""
    value = uuid.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    selector = f'{series}{{{uuid_label}="{value}",pod!=""}}'
    what = f"which pod holds {uuid}"
    answered = [
        ((s.labels.get("namespace", ""), s.labels.get("pod", "")), s.age_s)
        for s in series_ages(url, selector, timeout_s, what)
    ]
    fresh = sorted({pod for pod, age in answered if age <= max_age_s})
    if not fresh and answered:
        (namespace, name), age = min(answered, key=lambda a: a[1])
        named = printable(f"{namespace}/{name}")
        raise too_old(
            f"the pod of GPU {printable(uuid)}",
            named,
            age,
            max_age_s,
            "reclaim.max_sample_age_s",
            selector,
        )
    return fresh


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
                "annotations": {names.PREVIOUS_REPLICAS: str(replicas), **_marks(d, key)},
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
    """Deactivate the Workload of a Job Kueue manages (its ``kueue.x-k8s.io/queue-name``), or
    suspend a Job Kueue does not: a Kueue-managed Job is never suspended (Kueue owns it)."""
    if kueue_managed(job):
        return _deactivate(client, d, job, key, what)
    where = (*OWNERS["Job"], job["metadata"]["namespace"], job["metadata"]["name"])
    for attempt in range(CONFLICT_RETRIES):
        if attempt:
            job = client.get(*where)
        if (job.get("spec") or {}).get("suspend") is True:
            return Reclaimed(pod=key, reclaimed=True, owner=what, already=True)
        try:
            client.patch(*where, _stamped(d, job, key, {"suspend": True}))
        except KubeConflict:
            continue
        return Reclaimed(pod=key, reclaimed=True, owner=what)
    raise KubeConflict(f"{what} kept changing")


def kueue_managed(job: Mapping[str, Any]) -> bool:
    """A Job submitted to a Kueue queue (label, or the older annotation, ``queue-name``)."""
    meta = job.get("metadata") or {}
    return bool(
        (meta.get("labels") or {}).get(names.KUEUE_QUEUE)
        or (meta.get("annotations") or {}).get(names.KUEUE_QUEUE)
    )


def kueue_version(client: KubeClient, what: str) -> str:
    """The version of ``kueue.x-k8s.io`` to call (discovery: v1beta2 where served, else the
    preferred one); none served is a temporary error: the Job is not suspended instead."""
    versions = client.served_versions(KUEUE_GROUP)
    if not versions:
        raise TemporaryError(
            f"{what} is queued by Kueue ({names.KUEUE_QUEUE}) but the API server serves no "
            f"{KUEUE_GROUP}: not suspended (Kueue owns suspend); tried again later"
        )
    return "v1beta2" if "v1beta2" in versions else versions[0]


def _workload(
    client: KubeClient, version: str, job: Mapping[str, Any], what: str
) -> dict[str, Any]:
    """The Workload Kueue made for ``job`` (label ``kueue.x-k8s.io/job-uid``, owned by it)."""
    namespace, uid = job["metadata"]["namespace"], str(job["metadata"].get("uid") or "")
    try:
        found = client.list_objects(
            KUEUE_GROUP, version, WORKLOADS, namespace, f"{names.KUEUE_JOB_UID}={uid}"
        )
    except KubeNotFound as exc:
        raise TemporaryError(f"{what}: Kueue's Workloads cannot be listed now: {exc}") from exc
    for workload in found:
        if any(o.get("uid") == uid for o in workload["metadata"].get("ownerReferences") or []):
            return workload
    raise TemporaryError(f"{what} is queued by Kueue but has no Workload yet: tried again later")


def _deactivate(
    client: KubeClient, d: Decision, job: Mapping[str, Any], key: str, what: str
) -> Reclaimed:
    version = kueue_version(client, what)
    for _ in range(CONFLICT_RETRIES):
        workload = _workload(client, version, job, what)
        wname = workload["metadata"]["name"]
        owner = f"Workload {job['metadata']['namespace']}/{wname}"
        if (workload.get("spec") or {}).get("active") is False:
            return Reclaimed(pod=key, reclaimed=True, owner=owner, already=True)
        try:
            client.patch(
                KUEUE_GROUP,
                version,
                WORKLOADS,
                job["metadata"]["namespace"],
                wname,
                _stamped(d, workload, key, {"active": False}),
            )
        except KubeConflict:  # Kueue rewrites its Workloads often: read again
            continue
        return Reclaimed(pod=key, reclaimed=True, owner=owner)
    raise KubeConflict(f"the Workload of {what} kept changing")


def _stamped(
    d: Decision, obj: Mapping[str, Any], key: str, spec: Mapping[str, Any]
) -> dict[str, Any]:
    """A merge patch of ``spec`` with gpuops' reclaim marks (the undo's proof), conditional
    on ``obj``'s ``resourceVersion``."""
    return {
        "metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "annotations": _marks(d, key),
        },
        "spec": dict(spec),
    }


def _marks(d: Decision, key: str) -> dict[str, str]:
    return {
        names.RECLAIMED_BY: d.policy,
        names.RECLAIMED_POD: key.split("/", 1)[1],
        names.DECISION: d.id,
        names.EPISODE: names.episode_mark(d.episode_start),
        names.AT: _now(),
    }


MARKS = (
    names.RECLAIMED_BY,
    names.RECLAIMED_POD,
    names.PREVIOUS_REPLICAS,
    names.DECISION,
    names.EPISODE,
    names.AT,
)
"""The annotations a reclaim writes and its undo removes."""


class Restored(Result):
    pod: str
    restored: bool
    owner: str | None = None
    """What was scaled back, resumed or reactivated."""
    replicas: int | None = None
    why: str | None = None


def restore(client: KubeClient, d: Decision, namespace: str, pod: str) -> Restored:
    """The undo of ``reclaim``: the workload whose annotations say this policy reclaimed pod
    ``pod`` of ``namespace`` in this episode (the pod itself is gone) is scaled back to its
    previous replicas, its Job resumed, its Workload reactivated; nothing else is touched,
    and a workload someone changed since (scaled up, resumed) keeps their change."""
    key = f"{namespace}/{pod}"

    def ours(obj: Mapping[str, Any]) -> bool:
        a = obj["metadata"].get("annotations") or {}
        return (
            a.get(names.RECLAIMED_BY) == d.policy
            and a.get(names.RECLAIMED_POD) == pod
            and a.get(names.EPISODE) == names.episode_mark(d.episode_start)
        )

    for kind in ("Deployment", "StatefulSet"):
        for obj in client.list_objects(*OWNERS[kind], namespace):
            if ours(obj):
                return _scale_back(client, kind, obj, key)
    for obj in client.list_objects(*OWNERS["Job"], namespace):
        if ours(obj):
            done = _unmark(client, OWNERS["Job"], obj, {"suspend": False}, "suspend", True)
            return Restored(pod=key, restored=done, owner=f"Job {namespace}/{_name(obj)}")
    versions = client.served_versions(KUEUE_GROUP)
    if versions:
        version = "v1beta2" if "v1beta2" in versions else versions[0]
        kueue = (KUEUE_GROUP, version, WORKLOADS)
        for obj in client.list_objects(*kueue, namespace):
            if ours(obj):
                done = _unmark(client, kueue, obj, {"active": True}, "active", False)
                return Restored(pod=key, restored=done, owner=f"Workload {namespace}/{_name(obj)}")
    return Restored(
        pod=key, restored=False, why="no workload marked as reclaimed by gpuops in this episode"
    )


def _scale_back(client: KubeClient, kind: str, obj: Any, key: str) -> Restored:
    """Scale back to the previous replicas (first: a crash before the marks are removed
    finds it done), then remove the marks; one scaled since by someone else keeps its scale."""
    where = (*OWNERS[kind], obj["metadata"]["namespace"], obj["metadata"]["name"])
    what = f"{kind} {where[3]}/{where[4]}"
    for attempt in range(CONFLICT_RETRIES):
        if attempt:
            obj = client.get(*where)
        previous = int((obj["metadata"].get("annotations") or {}).get(names.PREVIOUS_REPLICAS) or 0)
        scale = client.scale(*where)
        replicas = int(scale["spec"].get("replicas") or 0)
        try:
            if replicas == 0 and previous > 0:
                scale["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                scale["spec"]["replicas"] = previous
                scaled = client.replace_scale(*where, scale)
                obj["metadata"]["resourceVersion"] = scaled["metadata"]["resourceVersion"]
            _forget(client, where[:3], obj)
        except KubeConflict:
            continue
        if replicas != 0:
            why = f"scaled to {replicas} by someone else since: left as it is"
            return Restored(pod=key, restored=False, owner=what, replicas=replicas, why=why)
        return Restored(pod=key, restored=True, owner=what, replicas=previous)
    raise KubeConflict(f"{what} kept changing")


def _unmark(
    client: KubeClient,
    kind: tuple[str, str, str],
    obj: Any,
    spec: Mapping[str, Any],
    field: str,
    reclaimed: bool,
) -> bool:
    """One patch: the marks removed and ``spec`` restored while ``field`` is still what the
    reclaim set (``reclaimed``); otherwise the marks only. Whether ``spec`` was restored."""
    where = (*kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
    for attempt in range(CONFLICT_RETRIES):
        if attempt:
            obj = client.get(*where)
        still = (obj.get("spec") or {}).get(field) is reclaimed
        try:
            _forget(client, kind, obj, spec if still else None)
        except KubeConflict:
            continue
        return still
    raise KubeConflict(f"{where[2]} {where[3]}/{where[4]} kept changing")


def _forget(
    client: KubeClient,
    kind: tuple[str, ...],
    obj: Any,
    spec: Mapping[str, Any] | None = None,
) -> None:
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "annotations": dict.fromkeys(MARKS),
        }
    }
    if spec is not None:
        patch["spec"] = dict(spec)
    client.patch(kind[0], kind[1], kind[2], obj["metadata"]["namespace"], _name(obj), patch)


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
