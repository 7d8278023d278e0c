"""The ``kubernetes`` executor: acts on a Kubernetes cluster through its API server (the client of
``gpuops.integrations.kubernetes.client``: the official ``kubernetes`` package, rate limited,
names checked and encoded as data; the names it writes: ``gpuops.integrations.kubernetes.names``).

``gpuops.actions.base.execute`` calls ``run``; its dispatch table routes each verb to its handler.
Before that, the gate asks ``standing`` (``gpuops.runtime.gate``): the veto label on the node or
the pod, and the selected nodes already unschedulable or NotReady, which ``max_fraction`` counts
whoever made them so. What each verb does, so that a repeated decision id has no second effect
and gpuops never undoes what it did not do:

- ``migrate`` (label ``node``): cordon the node with ownership annotations (policy, decision,
  episode, reason, time), the opt-in taint and the ``GpuopsCordoned`` condition, then drain it
  (``gpuops.actions.kubedrain``). A node cordoned by someone else keeps its cordon, unowned; a
  node whose gpuops cordon someone lifted is neither cordoned nor drained again in that
  episode (the outcome says ``cordoned: false`` and why). With a ``uuid``
  label (a GPU-level fault) only the pods holding that GPU are evicted (none when its ``pod``
  label is empty: a free GPU), and the node is cordoned only when the policy asks
  (``params.cordon: true``: the remediation ladder's quarantine, whose reboot needs the node).
- ``resume`` (the undo): uncordon only while the annotations name this policy's episode; a node
  someone else uncordoned has its annotations removed and the outcome says so.
- ``reclaim`` (labels ``namespace`` + ``pod``, or ``node`` + ``uuid`` found through
  Prometheus): the pod's owner chain; a Deployment or StatefulSet scaled to zero through
  ``/scale`` (the replicas before kept in an annotation), a Job suspended, a Kueue Workload
  deactivated (``spec.active=false``) for a Job queued by Kueue (never suspended); a pod
  without owner left alone unless configured.
- ``restore_workload`` (labels ``namespace`` + ``pod``), the undo of ``reclaim``: the workload
  whose annotations say this policy reclaimed that pod in this episode gets back its replicas,
  its Job resumed, its Workload reactivated; one changed since by someone else is left as is.
- ``scale_out`` / ``scale_in`` (label ``pool``): the ``/scale`` of the pool's configured
  resource, up to its maximum; scale-in takes back only replicas gpuops added.

Errors: the API server unreachable or failing, a 409 after the re-reads → ``TemporaryError``;
401/403 (naming the RBAC verb and resource), a name that is no Kubernetes name, a node outside
the selector → ``PermanentError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, field_validator

from gpuops.actions.base import ExecutorError, PermanentError, TemporaryError
from gpuops.actions.config import settings_of
from gpuops.actions.dispatch import Dispatch, on
from gpuops.actions.encoding import printable, target_label
from gpuops.actions.kubedrain import Drainer, DrainReport, DrainSettings, node_unavailable
from gpuops.actions.kubenodes import TAKEN_BACK, Cordons, Resumed
from gpuops.actions.kubepods import Reclaimed, Restored, pods_of_gpu, reclaim, restore
from gpuops.actions.kubescale import PoolSettings, Scaled, scale_pool
from gpuops.actions.results import Result
from gpuops.integrations.kubernetes import names
from gpuops.integrations.kubernetes.client import (
    CONFLICT_RETRIES,
    EXEC_TIMEOUT_S,
    NAME_RE,
    KubeClient,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeRejected,
    KubeTooManyRequests,
    KubeUnauthorized,
    KubeUnavailable,
    check_name,
)
from gpuops.integrations.kubernetes.selectors import Selector
from gpuops.model.decisions import Decision
from gpuops.model.guardrails import Standing
from gpuops.model.verbs import (
    MIGRATE,
    RECLAIM,
    RESTORE_WORKLOAD,
    RESUME,
    SCALE_IN,
    SCALE_OUT,
    NoParams,
    ScaleParams,
    implemented_by,
)

log = logging.getLogger(__name__)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReclaimSettings(_Model):
    bare_pods: Literal["leave", "delete"] = "leave"
    """A pod without owner: left alone (default), or deleted (nothing brings it back)."""
    prometheus_url: str | None = None
    """Where a GPU (``node``, ``uuid``) is mapped to its pod when the target has no ``pod``
    label; the engine configuration fills it with ``prometheus.url`` when not set."""
    gpu_series: str = "DCGM_FI_DEV_GPU_UTIL"
    """The series whose ``pod`` and ``namespace`` labels name the pod holding a GPU."""
    uuid_label: str = "UUID"
    """Its label holding the GPU's UUID (dcgm-exporter: ``UUID``; gpuops' NVML exporter:
    ``uuid``)."""
    max_sample_age_s: PositiveFloat = 30.0
    """Seconds: a series of ``gpu_series`` whose newest sample is older names no pod (fresh
    data only); the engine configuration fills it with the engine's bound,
    ``prometheus.max_sample_age`` (default 2 x ``prometheus.scrape_interval``)."""


class KubernetesSettings(_Model):
    """``executors.kubernetes`` in the engine configuration. Unknown keys are errors."""

    node_selector: str
    """Label selector of the nodes gpuops may touch (required: without it, nothing runs)."""
    kubeconfig: str | None = None
    """The kubeconfig file; None: ``in_cluster`` or the client's default (``~/.kube/config``)."""
    context: str | None = None
    in_cluster: bool = False
    """Use the pod's service account (the engine runs in the cluster)."""
    node_label: str = "node"
    """The target label naming the node."""
    veto: str = f"{names.VETO_LABEL}={names.VETO_VALUE}"
    """A node or pod carrying this label (``key=value`` or ``key``) is never acted on."""
    taint: bool = False
    """Also taint a cordoned node (``gpuops.io/unhealthy``)."""
    taint_effect: Literal["NoSchedule", "PreferNoSchedule"] = "NoSchedule"
    """Not ``NoExecute``: the taint manager would evict every pod, PodDisruptionBudgets
    ignored, the node agent's DaemonSet included."""
    condition: bool = True
    """Set the ``GpuopsCordoned`` node condition while gpuops' cordon holds."""
    drain: DrainSettings = DrainSettings()
    reclaim: ReclaimSettings = ReclaimSettings()
    pools: dict[str, PoolSettings] = {}
    qps: PositiveFloat = 5.0
    """API calls per second, at most (client-side token bucket)."""
    burst: PositiveInt = 10
    timeout_s: PositiveFloat = 10.0
    """Seconds per API call."""
    exec_timeout_s: PositiveFloat = EXEC_TIMEOUT_S
    """Seconds the kubeconfig's exec credential plugin may run (when the client is built, and
    at each token refresh) before it is killed with its process group: the action then fails
    temporarily, saying so, instead of hanging the executor."""

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(
                "name the nodes gpuops may touch with a label selector "
                "(e.g. nvidia.com/gpu.present=true): an empty one would select every node"
            )
        if not any(op in ("=", "") for _, op, _ in Selector.parse(value).requirements):
            raise ValueError(
                f"{value!r} selects nodes only by what they lack (k!=v, !k): it would select "
                "almost every node; name them with at least one key=value or key"
            )
        return value

    @field_validator("veto")
    @classmethod
    def _veto(cls, value: str) -> str:
        Selector.parse(value)
        return value


# --- results -----------------------------------------------------------------------------


class Migrated(Result):
    node: str
    cordoned: bool
    """Cordoned by this episode (False: cordoned by someone else, or a GPU-level fault)."""
    why: str | None = None
    evicted: list[str] = []
    deleted: list[str] = []
    skipped: list[str] = []
    held: list[str] = []
    """Pods still on the node at the drain's deadline, and why (a PodDisruptionBudget)."""
    budgets: list[str] = []
    """The PodDisruptionBudgets that held them."""
    kept: list[str] = []
    """Pods left running on purpose (a veto, a system namespace) that a reboot would stop."""
    stopping: list[str] = []
    """Pods found terminating within their grace period, that a reboot would cut short."""
    emptied: bool = False
    """The drain ran to its end (True): every pod is gone but those ``held``, ``kept`` or
    ``stopping``. False: not drained (a GPU-level fault, a node taken back) or the drain
    failed: what is on the node is not known."""
    api_calls: int = 0


class KubernetesExecutor:
    name = "kubernetes"
    verbs: frozenset[str] | None = implemented_by("kubernetes")

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        client: KubeClient | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings_of(KubernetesSettings, self.name, settings)
        s = self.settings
        self.selector = Selector.parse(s.node_selector)
        self.veto = Selector.parse(s.veto)
        self._client = client
        self._drainer: Drainer | None = None
        self._cordons: Cordons | None = None
        self._refused = False
        """The last action got a 401: one more is permanent."""
        self._build = threading.Lock()
        self._sleep = sleep
        self._clock = clock

    @property
    def client(self) -> KubeClient:
        """The API server's client, built at first use: a kubeconfig that cannot be loaded
        now (``KubeUnavailable``, naming the file) fails that action temporarily."""
        with self._build:  # lanes run in parallel: one client, one token bucket
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> KubeClient:
        s = self.settings
        return KubeClient(
            kubeconfig=s.kubeconfig,
            context=s.context,
            in_cluster=s.in_cluster,
            qps=s.qps,
            burst=s.burst,
            timeout_s=s.timeout_s,
            exec_timeout_s=s.exec_timeout_s,
        )

    @property
    def cordons(self) -> Cordons:
        if self._cordons is None:
            s = self.settings
            self._cordons = Cordons(self.client, s.taint, s.taint_effect, s.condition)
        return self._cordons

    @property
    def drainer(self) -> Drainer:
        if self._drainer is None:
            self._drainer = Drainer(
                self.client, self.settings.drain, self.veto, sleep=self._sleep, clock=self._clock
            )
        return self._drainer

    def run(self, decision: Decision) -> Result:
        try:
            done = DISPATCH.run(self, decision)
        except KubeUnauthorized as exc:
            with self._build:  # built anew from the kubeconfig at the next call
                self._client = self._cordons = self._drainer = None
            if self._refused:  # refused again with fresh credentials: they are wrong
                raise PermanentError(str(exc)) from exc
            self._refused = True  # an exec plugin's token or certificate expired
            raise TemporaryError(
                f"{exc}; the client is built again with fresh credentials"
            ) from exc
        except KubeUnavailable as exc:
            raise TemporaryError(str(exc)) from exc
        except KubeTooManyRequests as exc:  # API Priority and Fairness: wait as it asks
            raise TemporaryError(f"API server busy (429): {exc}", delay=exc.retry_after) from exc
        except KubeConflict as exc:
            raise TemporaryError(
                f"still conflicting after {CONFLICT_RETRIES} re-reads: {exc}"
            ) from exc
        except (KubeForbidden, KubeRejected, KubeNotFound) as exc:
            raise PermanentError(str(exc)) from exc
        self._refused = False
        return done

    # --- what the gate asks --------------------------------------------------------------

    def lane(self, decision: Decision) -> str:
        """The target's node (``""`` without one): a drain waiting on PodDisruptionBudgets
        holds up only the actions on its own node (``gpuops.actions.base.lane``)."""
        return str(decision.target.labels.get(self.settings.node_label) or "")

    def standing(self, decision: Decision) -> Standing:
        """What ``_standing`` reads; for a node-level ``migrate`` (which ``max_fraction``
        counts), an API server that cannot answer holds the action rather than letting it
        pass uncounted."""
        try:
            return self._standing(decision)
        except (KubeError, ExecutorError) as exc:
            labels = decision.target.labels
            if labels.get(self.settings.node_label) and _takes_node_out(decision):
                return Standing(
                    veto=f"the nodes max_fraction counts cannot be read now, so not cordoned: {exc}"
                )
            raise

    def _standing(self, decision: Decision) -> Standing:
        """The veto on the target's node or pods, and for ``migrate`` (a cordon takes a node
        out) the selected nodes already unschedulable or NotReady besides the target's, and
        how many are selected: asked by the gate."""
        labels = decision.target.labels
        node = labels.get(self.settings.node_label)
        counted = bool(node and _takes_node_out(decision))
        if counted:  # every selected node: max_fraction counts them
            nodes = self.client.nodes(self.settings.node_selector)
        elif node and NAME_RE.fullmatch(node):  # the target's node alone
            nodes = self.client.nodes(self.settings.node_selector, name=node)
        else:  # none, or no node name: the run refuses it
            nodes = []
        veto = None
        for item in nodes:
            meta = item["metadata"]
            if meta["name"] == node and self.veto.matches(meta.get("labels") or {}):
                veto = f"node {node} is labelled {self.settings.veto}"
        for found in self._pods_read(decision, node) if veto is None else []:
            if self.veto.matches(found["metadata"].get("labels") or {}):
                veto = f"pod {_key(found)} is labelled {self.settings.veto}"
        if not counted:
            return Standing(veto=veto)
        down = frozenset(
            n["metadata"]["name"]
            for n in nodes
            if n["metadata"]["name"] != node and node_unavailable(n)
        )
        return Standing(veto=veto, unavailable=down, population=len(nodes))

    def _pods_read(self, d: Decision, node: str | None) -> list[dict[str, Any]]:
        """The target's pods (its ``namespace``/``pod``, or its GPU's on ``node``) as they are
        now; none when they cannot be read (the action's run says why)."""
        labels = d.target.labels
        try:
            if labels.get("pod") and labels.get("namespace"):
                return [self.client.pod(labels["namespace"], labels["pod"])]
            if node and labels.get("uuid") and "pod" not in labels:
                return self._pods_of_gpu(d, node)
        except (KubeError, ExecutorError):
            return []
        return []

    # --- nodes: migrate / resume ---------------------------------------------------------

    def _node(self, d: Decision) -> dict[str, Any]:
        """The target's node, among the selected ones (one LIST); vetoed: refused."""
        return self._selected(target_label(d, self.settings.node_label))

    def _selected(self, name: str) -> dict[str, Any]:
        """Node ``name`` when ``node_selector`` selects it and it carries no veto (one LIST by
        the selector and ``metadata.name``: that node alone comes back)."""
        check_name("node", name)
        for node in self.client.nodes(self.settings.node_selector, name=name):
            if node["metadata"]["name"] == name:
                if self.veto.matches(node["metadata"].get("labels") or {}):
                    raise PermanentError(f"node {name} is labelled {self.settings.veto}")
                return node
        raise PermanentError(
            f"node {printable(name)} is not among the nodes of executors.kubernetes.node_selector "
            f"{self.settings.node_selector!r}: gpuops does not touch it"
        )

    def _resume(self, d: Decision, _: NoParams) -> Resumed:
        return self.cordons.resume(d, read=lambda: self._node(d))

    def _migrate(self, d: Decision, _: NoParams) -> Migrated:
        calls = self.client.calls
        node = self._node(d)
        name = node["metadata"]["name"]
        only = None
        if d.target.labels.get("uuid"):  # a GPU-level fault: only the pods of that GPU
            pods = self._pods_of_gpu(d, name)
            only = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods]
            if not _cordon(d):  # the device plugin keeps new pods off the bad GPU, the
                # node's other GPUs stay in service
                report = self.drainer.drain(name, only=only, force=_force(d))
                gpu_only = "a GPU-level fault: not cordoned"
                return _migrated(name, False, gpu_only, report, calls, self)
        cordoned, why = self.cordons.cordon(d, node, read=lambda: self._node(d))
        if why in TAKEN_BACK:  # a person took the node back in this episode: its pods stay
            return _migrated(name, False, why, DrainReport(), calls, self)
        try:
            report = self.drainer.drain(name, only=only, force=_force(d))
        except (KubeError, ExecutorError) as exc:  # the cordon holds: the undo must lift it
            log.warning("node %s: cordoned, then the drain failed: %s", name, exc)
            failed = f"cordoned; the drain failed: {exc}"
            return _migrated(name, cordoned, failed, DrainReport(), calls, self)
        return _migrated(name, cordoned, why, report, calls, self, emptied=only is None)

    # --- workloads: reclaim --------------------------------------------------------------

    def _pods_of_gpu(
        self,
        d: Decision,
        node: str,
        known: Mapping[tuple[str, str], dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        r = self.settings.reclaim
        return pods_of_gpu(
            self.client,
            d.target.labels,
            node,
            r.prometheus_url,
            r.gpu_series,
            r.uuid_label,
            self.settings.timeout_s,
            r.max_sample_age_s,
            known,
        )

    def _reclaim(self, d: Decision, _: NoParams) -> Reclaimed:
        labels = d.target.labels
        known: dict[tuple[str, str], dict[str, Any]] = {}
        if labels.get(self.settings.node_label):
            node = self._node(d)["metadata"]["name"]
        else:  # a pod-level target (namespace, pod): the node it runs on
            namespace, name = target_label(d, "namespace"), target_label(d, "pod")
            check_name("namespace", namespace)
            check_name("pod", name)
            known[(namespace, name)] = self.client.pod(namespace, name)
            where = (known[(namespace, name)].get("spec") or {}).get("nodeName")
            node = self._selected(str(where or ""))["metadata"]["name"]
        pods = self._pods_of_gpu(d, node, known)
        if len(pods) != 1:
            held = ", ".join(_key(p) for p in pods) or "none"
            raise PermanentError(f"GPU {d.target.labels.get('uuid')} is held by pods: {held}")
        return reclaim(self.client, d, pods[0], self.veto, self.settings.reclaim.bare_pods)

    def _restore_workload(self, d: Decision, _: NoParams) -> Restored:
        namespace, pod = target_label(d, "namespace"), target_label(d, "pod")
        check_name("namespace", namespace)
        check_name("pod", pod)
        return restore(self.client, d, namespace, pod)

    # --- capacity: scale_out / scale_in --------------------------------------------------

    def _scale_out(self, d: Decision, params: ScaleParams) -> Scaled:
        return scale_pool(self.client, self.settings.pools, d, params, +1)

    def _scale_in(self, d: Decision, params: ScaleParams) -> Scaled:
        return scale_pool(self.client, self.settings.pools, d, params, -1)


def _migrated(
    node: str,
    cordoned: bool,
    why: str | None,
    report: DrainReport,
    calls: int,
    k: KubernetesExecutor,
    emptied: bool = False,
) -> Migrated:
    """What a ``migrate`` did; ``emptied``: its drain of the whole node ran to its end."""
    said: dict[str, Any] = {"why": why} if why else {}
    if report.kept:
        said["kept"] = report.kept
    if report.stopping:
        said["stopping"] = report.stopping
    return Migrated(
        node=node,
        cordoned=cordoned,
        evicted=report.evicted,
        deleted=report.deleted,
        skipped=report.skipped,
        held=report.held,
        budgets=report.budgets,
        emptied=emptied,
        api_calls=k.client.calls - calls,
        **said,
    )


def _key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"


def _cordon(d: Decision) -> bool:
    """The policy asks a GPU-level fault's node to be cordoned too (``params.cordon``)."""
    value = d.action.params.get("cordon", False) if d.action is not None else False
    if not isinstance(value, bool):
        raise PermanentError(f"params.cordon of migrate must be true or false, not {value!r}")
    return value


def _takes_node_out(d: Decision) -> bool:
    """Whether ``d`` cordons its node: a ``migrate`` of a node, or of a GPU with
    ``params.cordon`` (what ``max_fraction`` counts)."""
    if d.action is None or d.action.type != MIGRATE.name:
        return False
    try:
        return not d.target.labels.get("uuid") or _cordon(d)
    except PermanentError:  # the run says why
        return False


def _force(d: Decision) -> bool:
    """The policy asks held pods to be deleted at the drain's deadline (``params.force_delete``)."""
    return bool(d.action is not None and d.action.params.get("force_delete") is True)


DISPATCH: Dispatch[KubernetesExecutor, Result] = Dispatch(
    KubernetesExecutor.name,
    (
        on(MIGRATE, KubernetesExecutor._migrate),
        on(RESUME, KubernetesExecutor._resume),
        on(RECLAIM, KubernetesExecutor._reclaim),
        on(RESTORE_WORKLOAD, KubernetesExecutor._restore_workload),
        on(SCALE_OUT, KubernetesExecutor._scale_out),
        on(SCALE_IN, KubernetesExecutor._scale_in),
    ),
)
"""Kubernetes' verbs, each to its handler."""
