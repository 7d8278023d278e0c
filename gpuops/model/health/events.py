"""Health events as values, and the alert a faulty GPU raises.

A ``HealthEvent`` is what a node agent pushes (``POST /api/v1/health/events``, decoded by
``gpuops.api.routes.health``): one XID or one lost GPU, with the agent's own event id. The
engine's health inbox (``gpuops.runtime.health``) counts XIDs with ``faults.xid_faults`` and,
for a faulty GPU, hands ``fault_alert`` to the alert inbox: the alert ``GpuFault``, whose
fingerprint is the GPU and the code and whose start is the event's time, so that the same
event sent twice, or replayed, is the same alert episode and decides nothing more.

The labels an agent sends with its node (``rack``, ``zone``) are data for its failure domains
only (``health.ladder.pacing.domains``): the engine keeps those the pacing names, and a domain
is never a label the alert sets itself (``FAULT_LABELS``) nor one an executor reads to choose
what it acts on (``TARGET_LABELS``). A domain's value is a label value of at most
``MAX_DOMAIN_VALUE`` characters (``domain_value_problem``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType

from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.health.catalogue import Remedy, XidClass
from gpuops.model.health.faults import XidFault

FAULT_ALERT = "GpuFault"
"""The ``alertname`` of a faulty GPU's alert (``rules/health/health.yaml`` acts on it)."""
FAULT_LABELS = frozenset(
    {"alertname", "node", "uuid", "xid", "class", "remedy", "reason", "pool", "profile"}
)
"""The labels ``fault_alert`` sets itself: a node label of the same name is refused."""
TARGET_LABELS = frozenset(
    {
        "pod",
        "namespace",
        "container",
        "instance",
        "job",
        "gpu",
        "quota_request",
        "priority_class",
    }
)
"""Labels an executor reads from a decision's target to choose what it acts on (the pods to
evict, the host to call, the job to requeue): never a failure domain, never taken from an
agent."""
MAX_DOMAIN_VALUE = 63
"""The longest value of a failure domain's label (a Kubernetes label value's bound)."""
_DOMAIN_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")

Labels = tuple[tuple[str, str], ...]
"""A node's labels as its agent sends them (``rack``, ``zone``), sorted by name."""


class EventKind(StrEnum):
    XID = "xid"
    """NVML reported an XID for the GPU (``xid`` says which)."""
    GPU_LOST = "gpu_lost"
    """The GPU stopped answering NVML (fell off the bus, ``NVML_ERROR_GPU_IS_LOST``)."""
    RETURNED = "returned"
    """The engine's own record: the node went back into service (no agent sends it)."""
    EARLIER_BOOT = "earlier_boot"
    """The engine's own record of an event from before its node's last reboot, kept by its id
    only: it neither acts nor counts in an XID's window (no agent sends it)."""


def domain_value_problem(value: str) -> str | None:
    """What makes ``value`` no failure domain's value, or None: 1 to ``MAX_DOMAIN_VALUE``
    letters, digits, ``-``, ``_`` or ``.``, beginning and ending with a letter or digit."""
    if len(value) > MAX_DOMAIN_VALUE:
        return f"is {len(value)} characters long (at most {MAX_DOMAIN_VALUE})"
    if not _DOMAIN_VALUE.fullmatch(value):
        return (
            "is not a label value (letters, digits, '-', '_' or '.', beginning and ending "
            "with a letter or digit)"
        )
    return None


@dataclass(frozen=True)
class HealthEvent:
    """One event of one GPU, as the node agent saw it at ``at`` (Unix seconds)."""

    id: str
    """The agent's id of the event: the same event sent again has the same id."""
    node: str
    gpu: str
    """The GPU's UUID."""
    kind: EventKind
    at: float
    xid: int | None = None
    pool: str = ""
    """The node's pool (Slurm: partition) as the agent knows it; empty: not sent."""
    labels: Labels = ()
    """The node's labels as the agent knows them (its rack, its zone: failure domains)."""
    boot_id: str = ""
    """The boot of its node NVML reported it in (the kernel's boot id); empty: not sent."""


@dataclass(frozen=True)
class Fault:
    """A GPU the engine takes out: why, what should heal it, since when."""

    node: str
    gpu: str
    reason: str
    remedy: Remedy
    at: float
    xid: int | None = None
    xid_class: XidClass = XidClass.HARDWARE
    pool: str = ""
    labels: Labels = ()

    @staticmethod
    def of_xid(fault: XidFault, pool: str = "", labels: Labels = ()) -> Fault:
        entry, threshold = fault.entry, fault.entry.threshold
        window = f" in {threshold.window_s:g}s" if threshold and threshold.count > 1 else ""
        reason = f"XID {entry.code} ({entry.description}) x{fault.count}{window}"
        return Fault(
            fault.node,
            fault.gpu,
            reason,
            fault.remedy,
            fault.last_at,
            entry.code,
            entry.xid_class,
            pool,
            labels,
        )

    @staticmethod
    def of_lost(event: HealthEvent) -> Fault:
        return Fault(
            event.node,
            event.gpu,
            "GPU lost",
            Remedy.REBOOT_NODE,
            event.at,
            pool=event.pool,
            labels=event.labels,
        )


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fault_alert(fault: Fault, profile: str) -> Alert:
    """The firing alert ``GpuFault`` of ``fault``: labels ``node``, ``uuid``, ``xid`` (empty
    for a lost GPU), ``class``, ``remedy``, ``reason``, ``pool`` and ``profile`` (what its
    pool's profile says: ``quarantine`` or ``observe``), and the node's labels its agent sent
    (``rack``, ``zone``; never one of those, nor one of ``TARGET_LABELS``)."""
    code = "" if fault.xid is None else str(fault.xid)
    identity = "\0".join(("gpuops-health", fault.node, fault.gpu, code or "lost"))
    labels = {
        **{k: v for k, v in fault.labels if k not in FAULT_LABELS | TARGET_LABELS},
        "alertname": FAULT_ALERT,
        "node": fault.node,
        "uuid": fault.gpu,
        "xid": code,
        "class": fault.xid_class.value,
        "remedy": fault.remedy.value,
        "reason": fault.reason,
        "pool": fault.pool,
        "profile": profile,
    }
    summary = f"GPU {fault.gpu} on {fault.node}: {fault.reason}; remedy {fault.remedy.value}"
    return Alert(
        fingerprint=hashlib.sha256(identity.encode()).hexdigest()[:16],
        status=AlertStatus.FIRING,
        labels=MappingProxyType(labels),
        annotations=MappingProxyType({"summary": summary}),
        starts_at=rfc3339(fault.at),
    )
