"""What the engine remembers about a policy between evaluations: a ``TargetState`` per target,
the ``PolicyState`` of all of them, and ``Quiet``, the bounds of their timers that let an
evaluation take a fast path (``gpuops.model.evaluation.fastpath``).

Made by the evaluation and settling modules beside this one; stored by ``gpuops.store`` (which
writes only the targets a ``Delta`` names) and read back by the runtime. Frozen values; the
``TargetState`` copies (``but``, ``seen_again``, ``observed``) skip ``dataclasses.replace``'s
``__init__``, because every target of every evaluation is copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from math import inf

from gpuops.model.decisions import EMPTY, freeze


class Status(StrEnum):
    PENDING = "pending"
    FIRING = "firing"
    CLEARING = "clearing"
    """Cleared, but its undo (``on_clear``) was held back by the guardrails: tried again."""


@dataclass(frozen=True)
class TargetState:
    """What the engine remembers about one target of one policy."""

    status: Status
    active_since: float
    """When the target entered the result: the episode's start, part of its decision ids."""
    last_seen: float
    value: float | None
    labels: Mapping[str, str]
    fired_at: float | None = None
    last_fire_at: float | None = None
    """When the last ``fire`` decision was made (repeat_interval counts from here)."""
    repeats: int = 0
    absent_since: float | None = None
    """First evaluation at which a firing target was missing (``keep_firing_for`` counts from
    here, as in Prometheus); for a pending target, the first evaluation of a stretch without
    fresh data (a failed query, stale samples), which ``Freshness.max_gap_s`` bounds."""
    actions: int = 0
    """This episode's actions that ran (or would have, in dry-run) and did not fail: while
    there is one, the clear runs ``on_clear``."""
    retry_at: float | None = None
    """A fire (or, while clearing, a clear) that the guardrails held back is decided again at
    this time if the target is still in the same state."""
    held: str | None = None
    """The suppression verdict (``suppressed:max_fraction``) holding this target's fire (or,
    while clearing, its undo) back now, as last recorded; a re-decision with the same verdict
    is not recorded again."""
    held_since: float | None = None
    """When ``held`` was recorded (the ``at`` of its decision)."""
    held_repeats: int = 0
    """Re-decisions of this target with the ``held`` verdict since it was recorded: counted,
    not recorded (docs/policies.md, "Suppressions are recorded once")."""

    @property
    def acted(self) -> bool:
        return self.actions > 0

    def but(self, **changes: object) -> TargetState:
        """``dataclasses.replace(self, **changes)`` without re-running ``__init__`` (a
        decision's target in the hot path: ``advance``, ``settle_all``)."""
        new = object.__new__(TargetState)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return new

    def seen_again(self, now: float, value: float) -> TargetState:
        """``but(last_seen=now, value=value, absent_since=None)``: a copy of the fields with
        the three set (every target of every evaluation)."""
        seen = object.__new__(TargetState)
        fields = seen.__dict__
        fields.update(self.__dict__)
        fields["last_seen"] = now
        fields["value"] = value
        fields["absent_since"] = None
        return seen

    def observed(self, last_seen: float, value: float) -> TargetState:
        """``but(last_seen=last_seen, value=value)`` (``PolicyState.seen``), as
        ``seen_again`` copies."""
        seen = object.__new__(TargetState)
        fields = seen.__dict__
        fields.update(self.__dict__)
        fields["last_seen"] = last_seen
        fields["value"] = value
        return seen

    def unheld(self) -> TargetState:
        """No longer held back by a suppression."""
        return self.but(held=None, held_since=None, held_repeats=0)


@dataclass(frozen=True)
class Quiet:
    """What a policy state's last full evaluation found (``PolicyState.quiet``): every target
    pending or firing and none absent; ``pending_since``, the earliest start among the
    pending ones, for the policy's ``for`` of ``for_s``; ``retry_at``, the earliest time a
    target held back is decided again (inf: none); ``last_fire_at``, the earliest last fire
    of a firing target (its ``repeat_interval`` counts from there; inf: none). While every
    target is seen again and nothing clears, no timer can expire before those: the
    evaluation takes its steady path (``fastpath.steady``). Each may be a bound (no later
    than the exact one): ``fastpath.due`` looks for the targets whose timer is due when it
    says one may be. ``pending``: every pending target's start by key (and perhaps some that
    are pending no more: checked when due), or None (not known): where only a pending start
    can be due, ``fastpath.due`` looks at these alone, not at every target (with churn that
    stays, a pending target reaches ``for`` in most evaluations)."""

    for_s: float
    pending_since: float
    retry_at: float
    last_fire_at: float = inf
    pending: Mapping[str, float] | None = None

    @classmethod
    def of(cls, targets: Mapping[str, TargetState], for_s: float) -> Quiet | None:
        """``Quiet`` of ``targets`` (None: a target is clearing or absent)."""
        since = retry = last = inf
        pending: dict[str, float] = {}
        for key, t in targets.items():
            if t.absent_since is not None:
                return None
            if t.retry_at is not None and t.retry_at < retry:
                retry = t.retry_at
            if t.status is Status.PENDING:
                pending[key] = t.active_since
                if t.active_since < since:
                    since = t.active_since
            elif t.status is not Status.FIRING:
                return None
            elif t.last_fire_at is not None and t.last_fire_at < last:
                last = t.last_fire_at
        return cls(for_s, since, retry, last, pending)


@dataclass(frozen=True)
class Delta:
    """How a state made by the churn path (``fastpath.churn``) differs from the state it came
    from (``PolicyState.parent``): ``base`` is that state's base; ``keys`` the targets whose
    ``TargetState`` is not the one in ``base`` (added or gone: every other target of the new
    base is ``base``'s own object, seen again through ``PolicyState.seen``). The store writes
    only these keys' rows (``StateStore.save_policy_state``)."""

    base: Mapping[str, TargetState]
    keys: frozenset[str]


class PolicyState:
    """The state of one policy: its non-inactive targets by key (a frozen value).

    Kept as ``base`` (the targets) plus ``seen`` (empty, or every base target's value in the
    base's order, seen at ``seen_at``: newer than the base's ``value`` and ``last_seen``) so
    that an evaluation in which every target is seen again and nothing changes
    (``fastpath.steady``) shares the base and keeps only the new values: no ``TargetState``,
    key or dict entry per target and evaluation. ``targets`` is the two merged (built once,
    when read)."""

    __slots__ = ("base", "seen", "seen_at", "quiet", "parent", "_targets")

    def __init__(
        self,
        targets: Mapping[str, TargetState] = EMPTY,
        *,
        seen: Sequence[float] = (),
        seen_at: float = -inf,
        quiet: Quiet | None = None,
        parent: Delta | None = None,
    ) -> None:
        self.base = targets
        self.seen = seen
        self.seen_at = seen_at
        self.quiet = quiet
        self.parent = parent
        self._targets: Mapping[str, TargetState] | None = None if seen else targets

    @property
    def targets(self) -> Mapping[str, TargetState]:
        merged = self._targets
        if merged is None:
            at = self.seen_at
            merged = self._targets = freeze(
                {
                    k: t.observed(at, v)
                    for (k, t), v in zip(self.base.items(), self.seen, strict=True)
                }
            )
        return merged

    def firing(self) -> list[str]:
        return [k for k, t in self.base.items() if t.status is not Status.PENDING]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PolicyState):
            return NotImplemented
        if (
            self.base is other.base
            and self.seen_at == other.seen_at
            and list(self.seen) == list(other.seen)
        ):  # the same values seen at the same time: equal without merging
            return True
        return self.targets == other.targets

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PolicyState(targets={dict(self.targets)!r})"
