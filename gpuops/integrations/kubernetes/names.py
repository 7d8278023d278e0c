"""The names gpuops writes on and reads from Kubernetes objects, and the RBAC rules of every API
call it makes: one place, read by the client (``gpuops.integrations.kubernetes.client``), the
``kubernetes`` executor (``gpuops.actions.kubernetes``), the ClusterRole of deploy/kubernetes
(a test checks that it grants exactly ``RBAC_RULES``) and docs/kubernetes.md.

Annotations on a node gpuops cordoned say who, which decision, which episode, why and when; a
node without them was cordoned by someone else and gpuops never uncordons it. Annotations on a
workload gpuops scaled to zero keep its replicas before; on a scalable resource, how many
replicas gpuops added (scale-in takes back at most those).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "gpuops.io"
"""The prefix of every label, annotation, taint and condition gpuops owns."""

# --- node: cordon with ownership (migrate, resume) ------------------------------------------

CORDONED_BY = f"{PREFIX}/cordoned-by"
"""Node annotation: the policy whose decision cordoned the node."""
DECISION = f"{PREFIX}/decision"
"""Annotation: the id of the decision that wrote the object's gpuops annotations."""
EPISODE = f"{PREFIX}/episode"
"""Node annotation: the episode (``<episode start, epoch seconds>``) of the cordon; the undo
uncordons only while it still names the undo's episode."""
REASON = f"{PREFIX}/reason"
"""Annotation: why (the policy's summary, or the verb and target)."""
AT = f"{PREFIX}/at"
"""Annotation: when gpuops wrote it (RFC 3339, UTC)."""
CANCELLED = f"{PREFIX}/cancelled"
"""Node annotation: the decision whose cordon someone else lifted (the episode is over: gpuops
does not cordon the node again for it)."""

TAINT_KEY = f"{PREFIX}/unhealthy"
"""The opt-in taint (``executors.kubernetes.taint``): ``NoSchedule`` by default."""
CONDITION_TYPE = "GpuopsCordoned"
"""The node condition gpuops sets while its cordon holds (status True, reason the verb)."""

# --- workloads: reclaim ----------------------------------------------------------------------

PREVIOUS_REPLICAS = f"{PREFIX}/previous-replicas"
"""Deployment/StatefulSet annotation: the replicas before gpuops scaled it to zero; on a pool's
scalable resource, the replicas before gpuops' last scale."""
REPLICAS = f"{PREFIX}/replicas"
"""Pool's scalable resource annotation: the replicas gpuops' last scale set (a replayed decision
makes its scale if a crash came between the mark and the scale)."""
RECLAIMED_BY = f"{PREFIX}/reclaimed-by"
"""Workload annotation (Deployment, StatefulSet, Job, Kueue Workload): the policy that scaled,
suspended or deactivated it."""

RECLAIMED_POD = f"{PREFIX}/reclaimed-pod"
"""Workload annotation: the pod whose idle GPU the reclaim took (the undo finds the workload by
it, the policy and the episode: the pod itself is gone)."""

# --- capacity: scale_out / scale_in ----------------------------------------------------------

SCALED_OUT = f"{PREFIX}/scaled-out"
"""Scalable resource annotation: how many replicas gpuops added and has not taken back."""

# --- what gpuops reads -----------------------------------------------------------------------

VETO_LABEL = f"{PREFIX}/do-not-touch"
VETO_VALUE = "true"
"""The default veto (``executors.kubernetes.veto``): a node or workload labelled
``gpuops.io/do-not-touch=true`` is never acted on; the gate records it as the suppression."""
DRAIN_MODE_LABEL = f"{PREFIX}/drain-mode"
"""Pod label choosing its drain mode (``immediate``, ``allow-completion``,
``delete-after-timeout``) over the configured ones."""
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
"""Job label (or older annotation): Kueue manages the Job; reclaim deactivates its Workload and
never suspends the Job."""
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
"""Workload label: the uid of the Job Kueue made the Workload for."""
MIRROR_POD = "kubernetes.io/config.mirror"
"""The annotation of a static (mirror) pod: never evicted."""

# --- the API calls, as RBAC rules --------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One PolicyRule of the ClusterRole: what gpuops calls, no more."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def as_policy_rule(self) -> dict[str, Any]:
        """As a ClusterRole's ``rules`` item."""
        return {
            "apiGroups": [self.api_group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


RBAC_RULES: tuple[Rule, ...] = (
    Rule("", ("nodes",), ("list", "patch"), "list the selected nodes; cordon, uncordon"),
    Rule("", ("nodes/status",), ("patch",), "the GpuopsCordoned node condition"),
    Rule("", ("pods",), ("get", "list", "delete"), "a node's pods; delete-after-timeout only"),
    Rule("", ("pods/eviction",), ("create",), "drain through the Eviction API"),
    Rule("policy", ("poddisruptionbudgets",), ("list",), "name the PDBs that hold a drain"),
    Rule("apps", ("replicasets",), ("get",), "a pod's owner chain"),
    Rule("apps", ("deployments", "statefulsets"), ("get", "list", "patch"), "previous-replicas"),
    Rule("apps", ("deployments/scale", "statefulsets/scale"), ("get", "update"), "reclaim"),
    Rule("batch", ("jobs",), ("get", "list", "patch"), "suspend a Job; its undo"),
    Rule("kueue.x-k8s.io", ("workloads",), ("list", "patch"), "spec.active=false"),
    Rule("cluster.x-k8s.io", ("machinedeployments",), ("get", "patch"), "scaled-out"),
    Rule("cluster.x-k8s.io", ("machinedeployments/scale",), ("get", "update"), "scale a pool"),
)
"""Every API call the ``kubernetes`` executor makes, as the ClusterRole grants it. A pool
scaled through another resource (``executors.kubernetes.pools``) needs the same two rules for
that resource (``rules_for_scalable``)."""


def rules_for_scalable(api_group: str, plural: str) -> tuple[Rule, ...]:
    """The rules a scalable resource of ``executors.kubernetes.pools`` needs."""
    return (
        Rule(api_group, (plural,), ("get", "patch"), "scaled-out"),
        Rule(api_group, (f"{plural}/scale",), ("get", "update"), "scale a pool"),
    )


def cluster_role_rules() -> list[dict[str, Any]]:
    """``RBAC_RULES`` as a ClusterRole's ``rules``."""
    return [rule.as_policy_rule() for rule in RBAC_RULES]


def episode_mark(episode_start: float) -> str:
    """The value of ``gpuops.io/episode``: the episode's start, epoch seconds."""
    return f"{episode_start:.3f}"


def verb_of(method: str) -> str:
    """The RBAC verb of an HTTP method (for the 403 message)."""
    return _VERBS.get(method.upper(), method.lower())


_VERBS: Mapping[str, str] = {
    "GET": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
