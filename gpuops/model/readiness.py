"""Why a policy has not acted (yet): each of its targets pending or firing now, and when it may
act next and what it waits for — its ``for``, its cooldown, ``max_per_hour``,
``repeat_interval``, a guardrail holding it back.

A pure view over a policy's stored ``PolicyState`` and the ``GuardrailState``, read by the
rules page of ``gpuops.api`` (``GET /api/v1/rules/{name}/targets``). The times are bounds from
what is stored: the next evaluation decides (the kill switch, a pause, ``max_fraction`` and the
global budget are judged then and can hold it longer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.guardrails import HOUR, GuardrailState, cooldown_key
from gpuops.model.rules.model import Policy


@dataclass(frozen=True)
class Readiness:
    """One target of a policy now: its state, and when it may act next (None: not again in
    this episode) with what it waits for, in words."""

    key: str
    labels: Mapping[str, str]
    status: str
    """pending, firing or clearing."""
    since: float
    """When the target entered the policy's result (its episode's start)."""
    value: float | None
    next_at: float | None
    waits_for: str


def readiness(
    policy: Policy, state: PolicyState, guardrails: GuardrailState, now: float, limit: int
) -> tuple[list[Readiness], int]:
    """The first ``limit`` targets of ``policy`` (pending first, then by key) and how many it
    has in all."""
    targets = state.targets
    order = sorted(targets, key=lambda k: (targets[k].status is not Status.PENDING, k))
    mine = sorted(e.at for e in guardrails.recent if e.policy == policy.name and now - e.at < HOUR)
    rate_free: float | None = None
    if policy.max_per_hour is not None and len(mine) >= policy.max_per_hour:
        rate_free = mine[len(mine) - policy.max_per_hour] + HOUR
    shown = [
        _one(policy, key, targets[key], guardrails, rate_free) for key in order[: max(limit, 0)]
    ]
    return shown, len(order)


def _one(
    policy: Policy,
    key: str,
    target: TargetState,
    guardrails: GuardrailState,
    rate_free: float | None,
) -> Readiness:
    at, why = _next(policy, key, target, guardrails, rate_free)
    return Readiness(
        key, target.labels, target.status.value, target.active_since, target.value, at, why
    )


def _next(
    policy: Policy,
    key: str,
    target: TargetState,
    guardrails: GuardrailState,
    rate_free: float | None,
) -> tuple[float | None, str]:
    """When ``target`` may act next and what it waits for (the latest of what holds it)."""
    held = f"({target.held or 'a guardrail'})"
    if target.status is Status.CLEARING:
        at = target.retry_at if target.retry_at is not None else target.last_seen
        return at, f"its undo is held back {held} and tried again"
    waits: list[tuple[float, str]] = []
    if target.status is Status.PENDING:
        waits.append((target.active_since + policy.for_s, f"for {duration(policy.for_s)}"))
    elif target.retry_at is not None:
        waits.append((target.retry_at, f"held back {held}"))
    elif policy.repeat_interval_s is not None and target.last_fire_at is not None:
        every = policy.repeat_interval_s
        waits.append((target.last_fire_at + every, f"repeat_interval {duration(every)}"))
    else:
        return None, "fired; acts again only after it clears and fires anew (no repeat_interval)"
    last = guardrails.last_action.get(cooldown_key(policy.name, key))
    if last is not None and policy.cooldown_s > 0:
        waits.append((last + policy.cooldown_s, f"cooldown {duration(policy.cooldown_s)}"))
    if rate_free is not None:
        waits.append((rate_free, f"max_per_hour {policy.max_per_hour}"))
    return max(waits, key=lambda w: w[0])


def duration(seconds: float) -> str:
    """``300`` as ``5m``, ``5400`` as ``1h30m``, ``0`` as ``0s``."""
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    if whole or not parts:
        parts.append(f"{whole}s")
    return "".join(parts)
