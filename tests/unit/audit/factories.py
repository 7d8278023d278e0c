"""Builders of decisions, spools and spooled documents, and helpers shared by the audit tests
(not a test module)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.settings import FullPolicy
from gpuops.audit.spool import Spool, read_spool
from gpuops.model.decisions import ActionSpec, Decision, Evidence, Target, Transition, decision_id
from tests.waiting import wait_for


def make_decision(
    verdict: str = "execute",
    policy: str = "reclaim-idle-gpus",
    labels: Mapping[str, str] | None = None,
    at: float = 1_700_000_000.0,
    transition: Transition = Transition.FIRE,
    action: str | None = "reclaim",
    reason: str = "",
    episode: float | None = None,
) -> Decision:
    target_labels = dict(labels or {"node": "n1", "uuid": "GPU-1"})
    target = Target.from_labels(target_labels, tuple(sorted(target_labels)))
    start = at - 600 if episode is None else episode
    return Decision(
        id=decision_id(policy, target.key, start, transition.value),
        policy=policy,
        group="gpu-efficiency",
        target=target,
        transition=transition,
        action=ActionSpec(action, "fleet", {"grace_s": 30}) if action else None,
        evidence=Evidence("max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.2", 0.05, start, at),
        at=at,
        episode_start=start,
        verdict=verdict,
        reason=reason,
        mode="enforce",
        labels={"team": "platform"},
    )


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    """``tests.waiting.wait_for`` under the name the audit tests use."""
    wait_for(condition, timeout_s, what, interval=0.01)


def make_spool(
    directory: Path, max_bytes: int = 10_000, policy: FullPolicy = "drop_oldest"
) -> tuple[Spool, CollectorRegistry]:
    registry = CollectorRegistry()
    spool = Spool(
        directory,
        segment_max_bytes=1_000,
        segment_max_age_s=60.0,
        max_bytes=max_bytes,
        full_policy=policy,
        fsync=True,
        metrics=AuditMetrics(registry),
    )
    spool.open()
    return spool, registry


def doc(n: int) -> dict[str, object]:
    return {"event": {"id": f"id-{n:04d}"}, "message": "x" * 80}


def ids(directory: Path) -> list[str]:
    return [d["event"]["id"] for d in read_spool(directory)]
