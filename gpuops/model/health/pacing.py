"""Paced repair: how many unproven repairs one failure domain (a pool) may have at once — a
purely computational slow start, not a latching breaker.

A domain's ``width`` starts at 1. A repair is unproven from its first step until its node has
stayed healthy for the dwell after its return; each repair proven adds 1 to the width, so
the width doubles each time all the repairs it let run hold (1, 2, 4, ...). A failed repair
(its node handed to a human, or faulty again within the dwell) drops the width to 1 and starts a
cooldown before the domain's next repair: 1 minute, doubled for each failure in a row up to
10, with jitter, never zero. Domains never wait for each other: a fault in a quiet pool is
repaired at once whatever floods another. The engine's ladder (``gpuops.runtime.ladder``) keeps
each domain's ``Domain`` in the store and asks ``deferred`` before a node's first step;
nothing here acts or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpuops.model.rules.durations import format_duration


@dataclass(frozen=True)
class Pace:
    """The pacing's settings as values (``health.ladder.pacing``)."""

    dwell_s: float = 300.0
    """How long a returned node stays healthy before its repair counts as proven."""
    cooldown_s: float = 60.0
    """The cooldown after a failed repair (doubled for each failure in a row)."""
    max_cooldown_s: float = 600.0
    jitter: float = 0.2
    """The cooldown is drawn within ± this fraction of itself."""


@dataclass(frozen=True)
class Domain:
    """One failure domain's pace (stored as JSON)."""

    name: str
    width: int = 1
    failures: int = 0
    """Failed repairs in a row (none proven since)."""
    cooldown_until: float = 0.0
    proven: int = 0
    """Repairs proven in this domain, ever."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Domain:
        return Domain(**dict(data))


def deferred(domain: Domain, unproven: int, pace: Pace, now: float) -> str | None:
    """Why a node of ``domain`` may not start its repair now (``unproven``: the domain's
    repairs not yet proven, the node's excluded), naming the domain; None: it may."""
    if now < domain.cooldown_until:
        left = format_duration(max(1.0, round(domain.cooldown_until - now)))
        return f"paced repair in {domain.name}: cooling down {left} after a failed repair"
    if unproven >= domain.width:
        return (
            f"paced repair in {domain.name}: {unproven} unproven repair(s) at width"
            f" {domain.width} (it grows as repairs stay healthy {format_duration(pace.dwell_s)})"
        )
    return None


def proved(domain: Domain) -> Domain:
    """A repair of ``domain`` stayed healthy for the dwell: one more may run at once."""
    return replace(domain, width=domain.width + 1, failures=0, proven=domain.proven + 1)


def failed(domain: Domain, pace: Pace, now: float, draw: float) -> Domain:
    """A repair of ``domain`` failed: width 1, and a cooldown (``draw`` in [0, 1) picks its
    jitter) before the domain's next repair."""
    base = min(pace.max_cooldown_s, pace.cooldown_s * 2.0**domain.failures)
    cooldown = max(1.0, base * (1.0 + pace.jitter * (2.0 * draw - 1.0)))
    return replace(domain, width=1, failures=domain.failures + 1, cooldown_until=now + cooldown)
