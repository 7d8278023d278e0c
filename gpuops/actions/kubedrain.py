"""Draining a node through the Eviction API, for the ``kubernetes`` executor
(``gpuops.actions.kubernetes``, its ``migrate``); and the label selectors its settings hold.

One LIST of the node's pods (field selector ``spec.nodeName``); DaemonSet pods, mirror (static)
pods, pods in the system namespaces, pods carrying the veto label, finished pods and pods
already terminating are skipped; the running pods skipped for a system namespace or the veto
are named in the report's ``kept`` too, and the pods terminating within their grace period
(their ``deletionTimestamp`` not passed) in its ``stopping``: what a reboot would cut short.
Each other pod is evicted (``policy/v1`` Eviction) by its drain mode: ``immediate``;
``allow-completion`` (left to finish until the deadline, then evicted); ``delete-after-timeout``
(evicted; still held by a PodDisruptionBudget at the deadline, deleted). A 429 with a
``DisruptionBudget`` cause (a PDB allows no disruption now; the API server sends no
Retry-After) is retried after ``backoff_s``, doubling up to ``max_backoff_s``, until
``timeout_s``; any other 429 (API Priority and Fairness) after its ``Retry-After``, and an
eviction that fails (500) is held and tried again the same way; then the pods still held and
the PDBs that hold them are named in the report (the outcome's ``held`` and ``budgets``; the
node stays cordoned, and the undo uncordons it as any other). Nothing is deleted by force
unless the policy asks (``params.force_delete: true``: every held pod is deleted at the
deadline).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator

from gpuops.integrations.kubernetes import names
from gpuops.integrations.kubernetes.client import (
    KubeClient,
    KubeConflict,
    KubeNotFound,
    KubeTooManyRequests,
    KubeUnavailable,
)
from gpuops.integrations.kubernetes.selectors import Selector

log = logging.getLogger(__name__)

DrainMode = Literal["immediate", "allow-completion", "delete-after-timeout"]
MODES: tuple[str, ...] = ("immediate", "allow-completion", "delete-after-timeout")
FINISHED = frozenset({"Succeeded", "Failed"})
TERMINATING = "terminating"
SYSTEM = "system namespace"
VETO = "veto"
KEPT = frozenset({SYSTEM, VETO})
"""Why a running pod is left on the node on purpose: a reboot would stop it (``kept``).
DaemonSet and mirror pods are the node's own: they stop and start with it."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModeRule(_Model):
    """Pods of ``namespace`` (any, when not set) matching ``selector`` (any, when not set)
    drain with ``mode``; the first rule that matches wins."""

    mode: DrainMode
    namespace: str | None = None
    selector: str | None = None

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        if value is not None:
            Selector.parse(value)
        return value


class DrainSettings(_Model):
    """``executors.kubernetes.drain``."""

    timeout_s: PositiveFloat = 600.0
    """How long a drain may wait for PodDisruptionBudgets and finishing pods."""
    backoff_s: PositiveFloat = 10.0
    """The first wait after a 429 (PodDisruptionBudget), doubling each time..."""
    max_backoff_s: PositiveFloat = 120.0
    """... up to this."""
    mode: DrainMode = "immediate"
    """The drain mode of a pod no rule and no ``gpuops.io/drain-mode`` label names."""
    modes: tuple[ModeRule, ...] = ()
    system_namespaces: frozenset[str] = Field(default=frozenset({"kube-system", "gpuops"}))
    """Pods here are never evicted (``gpuops``: the engine's own, deploy/kubernetes)."""


def node_unavailable(node: Mapping[str, Any]) -> bool:
    """Unschedulable (cordoned), or its Ready condition not True (NotReady or Unknown)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return True
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") != "True")
    return True


@dataclass
class DrainReport:
    evicted: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    """The pods still on the node at the deadline, each with what held it."""
    budgets: list[str] = field(default_factory=list)
    """The PodDisruptionBudgets of the held pods (``namespace/name (disruptionsAllowed n)``)."""
    kept: list[str] = field(default_factory=list)
    """The skipped pods left running on purpose (a system namespace, the veto label) that
    stop with the node: what holds a reboot (also in ``skipped``)."""
    stopping: list[str] = field(default_factory=list)
    """The skipped pods terminating within their grace period (also in ``skipped``)."""


class Drainer:
    """Drains nodes through ``client`` (module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        settings: DrainSettings,
        veto: Selector | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``wall``: the time of day, to compare with a pod's ``deletionTimestamp``."""
        self.client = client
        self.settings = settings
        self.veto = veto
        self.sleep = sleep
        self.clock = clock
        self.wall = wall
        self._rules = [
            (r, Selector.parse(r.selector) if r.selector else None) for r in settings.modes
        ]

    def mode(self, pod: Mapping[str, Any]) -> str:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        if labels.get(names.DRAIN_MODE_LABEL) in MODES:
            return str(labels[names.DRAIN_MODE_LABEL])
        for rule, selector in self._rules:
            if rule.namespace is not None and rule.namespace != meta.get("namespace"):
                continue
            if selector is not None and not selector.matches(labels):
                continue
            return rule.mode
        return self.settings.mode

    def skip(self, pod: Mapping[str, Any], kept: bool = True) -> str | None:
        """Why ``pod`` is not evicted, or None (``kept=False``: leaving out the reasons of
        ``KEPT``: whether it would be evicted but for them)."""
        meta = pod["metadata"]
        if kept and meta.get("namespace") in self.settings.system_namespaces:
            return SYSTEM
        if kept and self.veto is not None and self.veto.matches(meta.get("labels") or {}):
            return VETO
        if names.MIRROR_POD in (meta.get("annotations") or {}):
            return "mirror pod"
        if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            return "DaemonSet"
        if (pod.get("status") or {}).get("phase") in FINISHED:
            return "finished"
        if meta.get("deletionTimestamp"):
            return TERMINATING
        return None

    def _grace(self, pod: Mapping[str, Any]) -> str | None:
        """The ``deletionTimestamp`` of a terminating pod still within its grace period (the
        time it is to be gone by), or None: past it (stuck), or one that cannot be read."""
        stamp = str(pod["metadata"].get("deletionTimestamp") or "")
        try:
            until = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
        return stamp if until > self.wall() else None

    def drain(
        self, node: str, only: Iterable[tuple[str, str]] | None = None, force: bool = False
    ) -> DrainReport:
        """Evict the pods of ``node`` (only those of ``only``, (namespace, name), if given)."""
        report = DrainReport()
        wanted = None if only is None else set(only)
        pending: dict[str, dict[str, Any]] = {}
        for pod in self.client.pods_on(node):
            meta = pod["metadata"]
            key = f"{meta.get('namespace')}/{meta['name']}"
            if wanted is not None and (meta.get("namespace"), meta["name"]) not in wanted:
                continue
            why = self.skip(pod)
            if why is not None:
                report.skipped.append(f"{key} ({why})")
                if why in KEPT and self.skip(pod, kept=False) is None:
                    report.kept.append(f"{key} ({why})")
                elif why == TERMINATING and (until := self._grace(pod)) is not None:
                    report.stopping.append(f"{key} (terminating until {until})")
                continue
            pending[key] = pod
        deadline = self.clock() + self.settings.timeout_s
        delay = self.settings.backoff_s
        held: dict[str, str] = {}
        named: set[tuple[str, str]] = set()
        """The PodDisruptionBudgets the 429s named, (namespace, name)."""
        while pending:
            busy = 0.0
            budgets = False
            for key, pod in list(pending.items()):
                mode = self.mode(pod)
                namespace, name = key.split("/", 1)
                uid = pod["metadata"].get("uid")
                if mode == "allow-completion" and self.clock() < deadline:
                    try:
                        now_pod = self.client.pod(namespace, name)
                    except KubeNotFound:
                        now_pod = {}
                    phase = (now_pod.get("status") or {}).get("phase")
                    if now_pod.get("metadata", {}).get("uid") != uid or (
                        (now_pod.get("spec") or {}).get("nodeName") != node
                    ):  # gone, or a new pod of that name elsewhere: not this drain's
                        phase = "Succeeded"
                    if phase in FINISHED:
                        del pending[key]
                        report.skipped.append(f"{key} (finished)")
                    else:
                        held[key] = "allow-completion: still running"
                    continue
                try:
                    self.client.evict(namespace, name, uid)
                except KubeConflict:  # a new pod of that name (recreated): this one is gone
                    del pending[key]
                    held.pop(key, None)
                    report.skipped.append(f"{key} (gone: recreated)")
                    continue
                except KubeTooManyRequests as exc:
                    if exc.budget is None:  # API Priority and Fairness: not a budget
                        busy = max(busy, exc.retry_after or self.settings.backoff_s)
                        held[key] = f"API server busy (429): {exc}"
                    else:
                        budgets = True
                        held[key] = f"{exc} ({exc.budget})"
                        if m := _BUDGET_NAMED.match(exc.budget):
                            named.add((namespace, m.group(1)))
                    continue
                except KubeUnavailable as exc:  # this pod's eviction failed (500): held
                    held[key] = str(exc)
                    continue
                except KubeNotFound:
                    pass
                del pending[key]
                held.pop(key, None)
                report.evicted.append(key)
            now = self.clock()
            if not pending or now >= deadline:
                break
            wait = min(delay if budgets or not busy else busy, deadline - now)
            log.info(
                "drain of %s: %d pods held (%s); trying again in %.0f s",
                node,
                len(pending),
                ", ".join(sorted(pending)),
                wait,
            )
            self.sleep(wait)
            if budgets or not busy:  # a PodDisruptionBudget's backoff doubles
                delay = min(delay * 2, self.settings.max_backoff_s)
        for key, pod in list(pending.items()):
            if force or self.mode(pod) == "delete-after-timeout":
                namespace, name = key.split("/", 1)
                try:
                    self.client.delete_pod(namespace, name, pod["metadata"].get("uid"))
                except (KubeNotFound, KubeConflict):  # gone, or recreated: not deleted
                    del pending[key]
                    continue
                del pending[key]
                report.deleted.append(key)
        if pending:
            report.held = [f"{k}: {held.get(k, 'not evicted')}" for k in sorted(pending)]
            report.budgets = self._budgets(pending, named)
            log.warning(
                "drain of %s stopped at its deadline (%g s) with %d pods held: %s; "
                "PodDisruptionBudgets: %s; the node stays cordoned",
                node,
                self.settings.timeout_s,
                len(pending),
                "; ".join(report.held),
                ", ".join(report.budgets) or "none found",
            )
        return report

    def _budgets(
        self, pending: Mapping[str, Mapping[str, Any]], named: set[tuple[str, str]]
    ) -> list[str]:
        """The PDBs a 429 named, or whose selector matches a pod still held."""
        budgets = []
        for namespace in sorted({k.split("/", 1)[0] for k in pending}):
            for pdb in self.client.list_objects("policy", "v1", "poddisruptionbudgets", namespace):
                match = _pdb_selector(pdb)
                if (namespace, pdb["metadata"]["name"]) in named or any(
                    k.startswith(f"{namespace}/")
                    and match.matches(p["metadata"].get("labels") or {})
                    for k, p in pending.items()
                ):
                    allowed = (pdb.get("status") or {}).get("disruptionsAllowed", 0)
                    budgets.append(
                        f"{namespace}/{pdb['metadata']['name']} (disruptionsAllowed {allowed})"
                    )
        return budgets


_BUDGET_NAMED = re.compile(r"The disruption budget (\S+) ")
"""How kube-apiserver's ``DisruptionBudget`` cause names the PodDisruptionBudget."""


def _pdb_selector(pdb: Mapping[str, Any]) -> Selector:
    selector = (pdb.get("spec") or {}).get("selector") or {}
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        if expr.get("operator") == "Exists":
            parts.append(str(expr["key"]))
        elif expr.get("operator") == "DoesNotExist":
            parts.append(f"!{expr['key']}")
    try:
        return Selector.parse(",".join(parts)) if parts else Selector((("", "!", ""),))
    except ValueError:
        return Selector((("", "!", ""),))
