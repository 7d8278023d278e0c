"""Cordons with ownership, for the ``kubernetes`` executor (``gpuops.actions.kubernetes``, its
``migrate`` and ``resume``).

A cordon is one JSON merge patch of the node with its ``resourceVersion`` (a 409 is read again):
``spec.unschedulable``, the annotations that say which policy, decision and episode cordoned it,
why and when (``gpuops.integrations.kubernetes.names``), and the opt-in taint; the
``GpuopsCordoned`` condition follows (a strategic merge patch of ``nodes/status``). A node
cordoned by someone else is left cordoned and unowned; an owned cordon someone lifted ends the
episode (``gpuops.io/cancelled``: the node is neither cordoned nor drained again in it). Every
write carries the field manager ``gpuops``: the cordon is gpuops' only while the node's
``managedFields`` say gpuops owns ``spec.unschedulable``; one set again by someone else
(uncordoned, then cordoned for maintenance) keeps its cordon and loses gpuops' marks. The undo
removes gpuops' marks and the cordon in one patch, only while the marks name this policy and its
episode (or an earlier one whose cordon gpuops still owns: a migrate that failed after its
cordon).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuops.actions.results import Result
from gpuops.integrations.kubernetes import names
from gpuops.integrations.kubernetes.client import (
    CONFLICT_RETRIES,
    FIELD_MANAGER,
    KubeClient,
    KubeConflict,
    KubeError,
)
from gpuops.model.decisions import Decision

log = logging.getLogger(__name__)


LIFTED = "someone else uncordoned it in this episode: not cordoned again"
"""Why a cordon does not hold: a person lifted gpuops' cordon of this episode."""
RECORDONED = "cordoned again by someone else: their cordon, never lifted by gpuops"
"""Why a cordon does not hold: a person lifted gpuops' cordon and cordoned the node again."""
TAKEN_BACK = frozenset({LIFTED, RECORDONED})
"""A person took the node back from gpuops in this episode: it is not drained again in it."""


class Resumed(Result):
    node: str
    uncordoned: bool
    why: str | None = None


class Cordons:
    """Cordons and uncordons through ``client`` (module docstring)."""

    def __init__(self, client: KubeClient, taint: bool, taint_effect: str, condition: bool) -> None:
        self.client = client
        self.taint = taint
        self.taint_effect = taint_effect
        self.condition = condition

    def cordon(
        self, d: Decision, node: dict[str, Any], read: Callable[[], dict[str, Any]]
    ) -> tuple[bool, str | None]:
        """Cordon ``node`` (as read) for ``d``; ``read`` reads it again after a 409. Whether
        this episode's cordon holds, and why not."""
        for _ in range(CONFLICT_RETRIES):
            meta = node["metadata"]
            annotations = meta.get("annotations") or {}
            name = meta["name"]
            mine = annotations.get(names.CORDONED_BY) == d.policy
            ours = mine and annotations.get(names.EPISODE) == episode(d)
            unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
            if annotations.get(names.CANCELLED) == episode(d):
                return False, LIFTED
            if mine and unschedulable and not owns_cordon(node):  # re-cordoned by someone else
                try:
                    self.forget(node, cancelled=annotations.get(names.EPISODE))
                except KubeConflict:
                    node = read()
                    continue
                log.warning("node %s: cordoned again by someone else: their cordon stays", name)
                return False, RECORDONED
            if ours and not unschedulable:  # our cordon was lifted by someone else
                self.forget(node, cancelled=episode(d))
                if self.condition:
                    self.set_condition(name, "False", d)
                log.warning("node %s: gpuops' cordon was lifted by someone else", name)
                return False, LIFTED
            if unschedulable and not mine:
                log.info("node %s was cordoned before gpuops: its cordon stays unowned", name)
                return False, "cordoned by someone else before gpuops: never uncordoned by gpuops"
            if ours:
                return True, None  # this decision (or this episode) ran before
            # not cordoned, or gpuops' own cordon of an earlier episode (a migrate that failed
            # after it): cordoned, and marked, for this episode
            spec: dict[str, Any] = {"unschedulable": True}
            if self.taint:
                taints = [
                    t
                    for t in (node.get("spec") or {}).get("taints") or []
                    if t.get("key") != names.TAINT_KEY
                ]
                taint = {
                    "key": names.TAINT_KEY,
                    "value": taint_value(d.policy),
                    "effect": self.taint_effect,
                }
                spec["taints"] = [*taints, taint]
            patch = {
                "metadata": {
                    "resourceVersion": meta["resourceVersion"],
                    "annotations": {
                        names.CORDONED_BY: d.policy,
                        names.DECISION: d.id,
                        names.EPISODE: episode(d),
                        names.REASON: reason(d),
                        names.AT: _now(),
                    },
                },
                "spec": spec,
            }
            try:
                self.client.patch_node(name, patch)
            except KubeConflict:
                node = read()
                continue
            if self.condition:
                try:
                    self.set_condition(name, "True", d)
                except KubeError as exc:  # the cordon holds: say so, the undo lifts it
                    log.warning("node %s: cordoned; condition not set: %s", name, exc)
                    return True, f"cordoned; the {names.CONDITION_TYPE} condition: {exc}"
            return True, None
        raise KubeConflict(f"node {node['metadata']['name']} kept changing")

    def set_condition(self, node: str, status: str, d: Decision) -> None:
        now = _now()
        self.client.patch_node_status(
            node,
            {
                "status": {
                    "conditions": [
                        {
                            "type": names.CONDITION_TYPE,
                            "status": status,
                            "reason": "GpuopsMigrate" if status == "True" else "GpuopsResume",
                            "message": f"{d.policy}: {reason(d)}"[:1024],
                            "lastTransitionTime": now,
                            "lastHeartbeatTime": now,
                        }
                    ]
                }
            },
        )

    def forget(
        self, node: dict[str, Any], cancelled: str | None = None, uncordon: bool = False
    ) -> None:
        """One patch: gpuops' annotations and taint removed (the episode marked cancelled; the
        node uncordoned), on the condition that the node is as it was read."""
        annotations: dict[str, Any] = {
            key: None
            for key in (names.CORDONED_BY, names.DECISION, names.EPISODE, names.REASON, names.AT)
        }
        if cancelled is not None:
            annotations[names.CANCELLED] = cancelled
        meta = node["metadata"]
        spec: dict[str, Any] = {"unschedulable": None} if uncordon else {}
        taints = (node.get("spec") or {}).get("taints") or []
        if any(t.get("key") == names.TAINT_KEY for t in taints):
            spec["taints"] = [t for t in taints if t.get("key") != names.TAINT_KEY] or None
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations}
        }
        if spec:
            patch["spec"] = spec
        self.client.patch_node(meta["name"], patch)

    def resume(self, d: Decision, read: Callable[[], dict[str, Any]]) -> Resumed:
        """Uncordon the node ``read`` reads when gpuops cordoned it in ``d``'s episode."""
        for _attempt in range(CONFLICT_RETRIES):
            node = read()
            meta = node["metadata"]
            name = meta["name"]
            annotations = meta.get("annotations") or {}
            marked = annotations.get(names.EPISODE)
            lifted = not (node.get("spec") or {}).get("unschedulable")
            if annotations.get(names.CORDONED_BY) != d.policy or not (
                marked == episode(d)
                or (not lifted and owns_cordon(node) and _older(marked, episode(d)))
            ):
                why = "not cordoned by gpuops in this episode: left as it is"
                return Resumed(node=name, uncordoned=False, why=why)
            if not lifted and not owns_cordon(node):  # uncordoned, then cordoned by someone
                try:
                    self.forget(node, cancelled=marked)
                except KubeConflict:
                    continue
                why = "cordoned again by someone else: their cordon stays"
                log.warning("node %s: %s", name, why)
                return Resumed(node=name, uncordoned=False, why=why)
            try:
                self.forget(node, cancelled=episode(d) if lifted else None, uncordon=True)
            except KubeConflict:
                continue
            if self.condition:
                self.set_condition(name, "False", d)
            if lifted:
                log.warning("node %s: gpuops' cordon was lifted by someone else", name)
                return Resumed(node=name, uncordoned=False, why="uncordoned by someone else")
            return Resumed(node=name, uncordoned=True)
        raise KubeConflict("the node kept changing")


def owns_cordon(node: Mapping[str, Any]) -> bool:
    """Whether gpuops' field manager owns the node's ``spec.unschedulable`` (its
    ``managedFields``): a cordon someone else set again, even over gpuops' annotations
    (``kubectl uncordon`` then ``kubectl cordon``), is theirs."""
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:unschedulable" in spec:
            return bool(entry.get("manager") == FIELD_MANAGER)
    return False


def _older(marked: str | None, mine: str) -> bool:
    """Whether the episode ``marked`` began before ``mine`` (a cordon left by a migrate of an
    earlier episode that failed after it)."""
    try:
        return marked is not None and float(marked) < float(mine)
    except ValueError:
        return False


def taint_value(policy: str) -> str:
    """The taint's value: the policy's name as a label value (at most 63 characters,
    alphanumeric at both ends), which the API server requires of a taint value."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", policy)[:63].strip("-_.")


def episode(d: Decision) -> str:
    """The episode a cordon belongs to (``gpuops.io/episode``): its start, epoch seconds."""
    return names.episode_mark(d.episode_start)


def reason(d: Decision) -> str:
    return str(
        d.annotations.get("summary") or f"{d.action.type if d.action else ''} {d.target.key}"
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
