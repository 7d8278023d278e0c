"""Paced repair: how many unproven repairs one failure domain (a pool, a rack, a zone, the
policy) may have at once — a purely computational slow start, not a latching breaker — and
the bound on a domain's nodes out of service.

A domain's ``width`` starts at 1. A repair is unproven from its first step until its node has
stayed healthy for the dwell after its return; each repair proven adds 1 to the width, so
the width doubles each time all the repairs it let run hold (1, 2, 4, ...). A failed repair
(its node handed to a human, or faulty again within the dwell) drops the width to 1 and starts a
cooldown before the domain's next repair: 1 minute, doubled for each failure in a row up to
10, with jitter, never zero. Domains never wait for each other: a fault in a quiet pool is
repaired at once whatever floods another.

A node belongs to one domain per label that ``health.ladder.pacing.domains`` names
(``domains_of``: ``pool=a100``, ``rack=r12``), and its repair starts only when every one of
them has room. With ``max_fraction``, a domain whose nodes out of service — by the scheduler's
fresh view, counted by ``Outage`` — are past its bound holds it too (``over_bound``; never
zero: one node of any domain may be out). The nodes out because gpuops quarantined them
(waiting for their repair, repaired, or handed to a human) are not counted: they never hold
each other's repair, so a flood of faults is repaired at the domain's width; and starting the
repair of a node out already takes no more out. The engine's ladder
(``gpuops.runtime.ladder``) keeps each domain's ``Domain`` in the store and asks ``deferred``
and ``over_bound`` before a node's first step; nothing here acts or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
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


DEFAULT = "default"
"""The value of a domain label a node came without (``pool=default``)."""
POLICY = "policy"
"""The domain label that names the policy whose quarantine put the node on the ladder."""


def domains_of(names: Sequence[str], labels: Mapping[str, str]) -> tuple[str, ...]:
    """The failure domains of a node whose labels (its ``pool``, ``policy`` and the labels its
    agent sent) are ``labels``: ``name=value`` for each of ``names``, in their order."""
    return tuple(f"{name}={labels.get(name) or DEFAULT}" for name in names)


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


@dataclass(frozen=True)
class Outage:
    """One domain's nodes as the scheduler sees them now, leaving out the node to repair."""

    nodes: int
    """The domain's nodes (the node to repair included)."""
    out: tuple[str, ...]
    """The other nodes of the domain out of service, sorted: for any reason but a quarantine
    of gpuops that its ladder is repairing or handed to a human."""
    down: bool = False
    """The node to repair is out of service already: starting its repair takes no more out."""


def outages(
    names: Iterable[str],
    nodes: Iterable[tuple[Mapping[str, str], bool]],
    node: str,
    quarantined: Collection[str] = (),
) -> dict[str, Outage]:
    """Each domain of the labels ``names`` counted from ``nodes`` (one node's labels, with
    ``node``, and whether it is out of service), leaving ``node`` and the ``quarantined`` ones
    (out because gpuops quarantined them: they wait for, or had, their own repair) out of
    ``out``."""
    sizes: dict[str, int] = {}
    out: dict[str, list[str]] = {}
    down = False
    for labels, unavailable in nodes:
        name_of = labels.get("node", "")
        if name_of == node:
            down = down or unavailable
        for name in names:
            domain = f"{name}={labels.get(name) or DEFAULT}"
            sizes[domain] = sizes.get(domain, 0) + 1
            found = out.setdefault(domain, [])
            if unavailable and name_of != node and name_of not in quarantined:
                found.append(name_of)
    return {d: Outage(n, tuple(sorted(out[d])), down) for d, n in sizes.items()}


def allowed(nodes: int, max_fraction: float) -> int:
    """How many nodes of a domain of ``nodes`` may be out of service: ``max_fraction`` of
    them, rounded down, never less than one."""
    return max(1, math.floor(nodes * max_fraction + 1e-9))


def over_bound(name: str, outage: Outage, max_fraction: float) -> str | None:
    """Why the repair of a node of domain ``name`` may not start while ``outage`` stands,
    naming the domain; None: it may. The node's repair counts only when it would take the
    node out (it is in service now): a node out already adds nothing, and is held only while
    the domain's other nodes out are past the bound (a domain's own trouble)."""
    bound = allowed(outage.nodes, max_fraction)
    if len(outage.out) + (0 if outage.down else 1) <= bound:
        return None
    shown = ", ".join(outage.out[:5]) + (", ..." if len(outage.out) > 5 else "")
    where = "past" if outage.down else "at"
    return (
        f"paced repair in {name}: {len(outage.out)} other node(s) of {outage.nodes} out of"
        f" service ({shown}), {where} its bound of {bound} (max_fraction {max_fraction:g})"
    )
