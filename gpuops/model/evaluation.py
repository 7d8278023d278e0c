"""Pure evaluation of one policy: (policy, query result, previous state, now) → (decisions, state).

Per (policy, target key) a target is ``pending`` then ``firing``, exactly
like a Prometheus alerting rule, plus hysteresis (``clear_expr``), ``keep_firing_for``,
``repeat_interval``, stable decision ids, and freshness: a target whose input series have no
sample newer than ``Freshness.max_sample_age_s`` has no data (``gpuops.model.staleness``), and a
pending timer does not run across a gap without fresh data longer than ``Freshness.max_gap_s``
(docs/policies.md). No I/O, no clock,
no globals: the live loop (``gpuops.runtime``), Alertmanager triggers and backtests all call
``evaluate`` unchanged; the guardrails (``gpuops.model.guardrails``) judge its decisions afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from itertools import compress
from math import inf
from types import MappingProxyType
from typing import Any

from gpuops.model.decisions import (
    EMPTY,
    Decision,
    Evidence,
    Sample,
    SkippedEvaluation,
    Target,
    Transition,
    Vector,
    Verdict,
    decision_id,
    freeze,
    key_value,
)
from gpuops.model.rules.model import Policy
from gpuops.model.rules.templating import PLACEHOLDER, render
from gpuops.model.staleness import StaleInput, describe, held_targets


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


@dataclass(frozen=True)
class Quiet:
    """What a policy state's last full evaluation found (``PolicyState.quiet``): every target
    pending or firing and none absent; ``pending_since``, the earliest start among the
    pending ones, for the policy's ``for`` of ``for_s``; ``retry_at``, the earliest time a
    target held back is decided again (inf: none); ``last_fire_at``, the earliest last fire
    of a firing target (its ``repeat_interval`` counts from there; inf: none). While every
    target is seen again and nothing clears, no timer can expire before those: the
    evaluation takes its steady path (``_steady``). Each may be a bound (no later than the
    exact one): ``_due`` looks for the targets whose timer is due when it says one may be.
    ``pending``: every pending target's start by key (and perhaps some that no longer are:
    checked when due), or None (not known): where only a pending start can be due, ``_due``
    looks at these alone, not at every target (issue 15: with churn that stays, a pending
    target reaches ``for`` in most rounds)."""

    for_s: float
    pending_since: float
    retry_at: float
    last_fire_at: float = inf
    pending: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Delta:
    """How a state made by the churn path (``_delta``) differs from the state it came from
    (``PolicyState.parent``): ``base`` is that state's base; ``keys`` the targets whose
    ``TargetState`` is not the one in ``base`` (added or gone: every other target of the new
    base is ``base``'s own object, seen again through ``PolicyState.seen``). The store writes
    only these keys' rows (``StateStore.save_policy_state``)."""

    base: Mapping[str, TargetState]
    keys: frozenset[str]


class PolicyState:
    """The state of one policy: its non-inactive targets by key (a frozen value).

    Kept as ``base`` (the targets) plus ``seen`` (empty, or every base target's value in the
    base's order, seen at ``seen_at``: newer than the base's ``value`` and ``last_seen``) so
    that an evaluation in which every target is seen again and nothing changes (``_steady``)
    shares the base and keeps only the new values: no ``TargetState``, key or dict entry per
    target and round (issue 15). ``targets`` is the two merged (built once, when read)."""

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
                    k: _observed(t, at, v)
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


@dataclass(frozen=True)
class QueryResult:
    """What the runtime got for a policy at ``now``.

        ``clear_samples`` is the result of ``clear_expr`` (None when the policy has none or when no
        target was firing); ``error`` says the query failed, which changes no timer (it only notes
    where a stretch without fresh data began).
        ``stale``: the input series of the queries whose newest sample is older than the
        freshness bound, per input (empty: none, or not asked: backtests).
    """

    samples: Sequence[Sample] = ()
    clear_samples: Sequence[Sample] | None = None
    error: str | None = None
    stale: Sequence[StaleInput] = ()


@dataclass(frozen=True)
class Freshness:
    """When data is fresh enough to act on (the runtime derives it from its configuration;
    the defaults, no bound, are those of backtests, whose data is history)."""

    max_sample_age_s: float = inf
    """An input series whose newest sample is older than this is stale: the targets it is
    attributed to have no data (nothing acted on, no timer moved); the others are judged."""
    max_gap_s: float = inf
    """A stretch of failed or stale evaluations longer than this (from the first of them to
    the next fresh one) starts the ``for`` of pending targets again: an outage does not count
    towards ``for``. Time without any evaluation (the engine restarting) is no such stretch."""


@dataclass(frozen=True)
class Step:
    decisions: tuple[Decision, ...]
    state: PolicyState
    skipped: SkippedEvaluation | None = None


def index_targets(policy: Policy, samples: Iterable[Sample]) -> dict[str, tuple[Target, Sample]]:
    """Group samples by target key; several series of one target keep the first one seen."""
    found: dict[str, tuple[Target, Sample]] = {}
    for sample in samples:
        target = Target.from_labels(sample.labels, policy.target)
        found.setdefault(target.key, (target, sample))
    return found


def _by_key(policy: Policy, samples: Iterable[Sample]) -> dict[str, Sample]:
    """``index_targets`` without building a ``Target`` per sample (most targets of an
    evaluation were seen before: their ``Target`` is built only when a decision needs it)."""
    found: dict[str, Sample] = {}
    names = policy.target
    keys = samples.target_keys(names) if isinstance(samples, Vector) else None
    if keys is not None:
        assert isinstance(samples, Vector)
        for index, key in enumerate(keys):
            if key not in found:
                found[key] = samples[index]
        return found
    if not names:
        for sample in samples:
            found.setdefault(Target.from_labels(sample.labels, names).key, sample)
        return found
    parts = _key_parts(names)
    for sample in samples:
        get = sample.labels.get
        key = ",".join([prefix + key_value(get(name, "")) for prefix, name in parts])
        if key not in found:
            found[key] = sample
    return found


@lru_cache(maxsize=4096)
def _key_parts(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(``name=``, name) per target label, in the order ``Target.from_labels`` keys them."""
    return tuple((f"{name}=", name) for name in sorted(set(names) - {"__name__"}))


def evaluate(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    now: float,
    freshness: Freshness = Freshness(),  # noqa: B008 (frozen)
) -> Step:
    """Advance ``policy``'s state machine to ``now`` with ``result``."""
    if result.error is not None:
        return _no_data(policy, result.error, state, now)
    if result.stale:
        return _around_stale(policy, result, state, now, freshness)
    due = _due(policy, state, now)
    steady = _steady(policy, result, state, due, now)
    if steady is not None:
        return steady
    churn = _delta(policy, result, state, *due, now) if due is not None else None
    if churn is not None:
        return churn

    matched = _by_key(policy, result.samples)
    cleared = (
        _by_key(policy, result.clear_samples).keys()
        if result.clear_samples is not None
        else frozenset()
    )
    targets: dict[str, TargetState] = {}
    decisions: list[Decision] = []
    before = state.targets
    previous = before.get
    max_gap_s = freshness.max_gap_s

    for key, sample in matched.items():
        prev = previous(key)
        if prev is not None and prev.status is Status.PENDING:  # the common cases first
            if prev.absent_since is None or now - prev.absent_since <= max_gap_s:
                current = _seen_again(prev, now, sample.value)
                if now - current.active_since >= policy.for_s:
                    current, decision = _advance(policy, Target(key, prev.labels), current, now)
                    if decision is not None:
                        decisions.append(decision)
                targets[key] = current
                continue
        elif (
            prev is not None
            and prev.status is Status.FIRING
            and key not in cleared
            and prev.retry_at is None
            and policy.repeat_interval_s is None
        ):
            targets[key] = _seen_again(prev, now, sample.value)  # firing on, nothing to decide
            continue
        key, next_state, decision = _target_step(
            policy, key, prev, sample, key in cleared, now, max_gap_s
        )
        if decision is not None:
            decisions.append(decision)
        if next_state is not None:
            targets[key] = next_state  # the same key, interned when new (Target.from_labels)

    for key, prev in before.items():
        if key in matched:
            continue
        if prev.status is Status.PENDING:
            continue  # left the result before `for` elapsed: back to inactive, no decision
        target = Target(key=key, labels=prev.labels)
        if prev.status is Status.CLEARING:
            if prev.retry_at is not None and now >= prev.retry_at:
                retry = replace(prev, repeats=prev.repeats + 1)
                decisions.append(_decide(policy, target, retry, Transition.CLEAR, now, prev.value))
                targets[key] = retry  # ``settle_all`` drops it once the undo may run
            else:
                targets[key] = prev
            continue
        if policy.clear_expr is not None:
            if key in cleared:
                decisions.append(_decide(policy, target, prev, Transition.CLEAR, now, prev.value))
            else:
                targets[key] = prev  # hysteresis: firing until clear_expr matches
        else:
            absent_since = prev.absent_since if prev.absent_since is not None else now
            if now - absent_since >= policy.keep_firing_for_s:
                decisions.append(_decide(policy, target, prev, Transition.CLEAR, now, prev.value))
            else:
                targets[key] = replace(prev, absent_since=absent_since)

    return Step(tuple(decisions), PolicyState(freeze(targets), quiet=_quiet(targets, policy.for_s)))


def _around_stale(
    policy: Policy, result: QueryResult, state: PolicyState, now: float, freshness: Freshness
) -> Step:
    """``evaluate`` when some input series are stale: the targets they are attributed to
    (``gpuops.model.staleness.held_targets``: in the answers or in ``state``) are held as on a
    failed
    query (``_no_data``); the others are evaluated on the rest of the answers. The skipped
    evaluation names the held targets (all of them: the whole evaluation skipped)."""
    matched = _by_key(policy, result.samples)
    cleared = _by_key(policy, result.clear_samples) if result.clear_samples is not None else {}
    candidates = {
        key: Target.from_labels(sample.labels, policy.target).labels
        for answers in (matched, cleared)
        for key, sample in answers.items()
    }
    for key, prev in state.targets.items():
        candidates.setdefault(key, prev.labels)
    why = describe(result.stale, freshness.max_sample_age_s)
    held = held_targets(policy, result.stale, candidates.items())
    if held.every:
        return _no_data(policy, why, state, now, reason=STALE_DATA)
    if not held.keys:  # stale series no target rests on (a GPU no longer in the result)
        return evaluate(policy, replace(result, stale=()), state, now, freshness)
    keys = held.keys
    rest = evaluate(
        policy,
        QueryResult(
            [s for k, s in matched.items() if k not in keys],
            [s for k, s in cleared.items() if k not in keys]
            if result.clear_samples is not None
            else None,
        ),
        PolicyState(freeze({k: t for k, t in state.targets.items() if k not in keys})),
        now,
        freshness,
    )
    kept = PolicyState(freeze({k: t for k, t in state.targets.items() if k in keys}))
    targets = {**rest.state.targets, **_no_data(policy, why, kept, now).state.targets}
    shown = sorted(keys)
    names = ", ".join(shown[:MAX_HELD_NAMED]) + (
        f" and {len(shown) - MAX_HELD_NAMED} more" if len(shown) > MAX_HELD_NAMED else ""
    )
    skipped = SkippedEvaluation(
        policy.name,
        policy.group,
        now,
        f"{why}: {len(shown)} target{'s' if len(shown) != 1 else ''} held ({names});"
        " the others were evaluated",
        STALE_DATA,
        tuple(shown),
    )
    return Step(
        rest.decisions,
        PolicyState(freeze(targets), quiet=_quiet(targets, policy.for_s)),
        skipped,
    )


STALE_DATA = "stale data"
"""The reason of an evaluation skipped (wholly or for some targets) on stale input."""

MAX_HELD_NAMED = 10
"""How many held targets a skipped evaluation's message names (the rest are counted)."""


def _target_step(
    policy: Policy,
    key: str,
    prev: TargetState | None,
    sample: Sample,
    cleared: bool,
    now: float,
    max_gap_s: float,
) -> tuple[str, TargetState | None, Decision | None]:
    """One target in the answer, as the general path decides it (its shortcuts for a
    pending target seen again and a firing one with nothing to decide give the same): its
    key (interned when new: ``Target.from_labels``), its next state (None: it cleared) and
    its decision, if any."""
    target = (
        Target(key, prev.labels)
        if prev is not None
        else Target.from_labels(sample.labels, policy.target)
    )
    if prev is not None and prev.status is Status.FIRING and cleared:
        return key, None, _decide(policy, target, prev, Transition.CLEAR, now, sample.value)
    if prev is not None and prev.status is Status.CLEARING:
        # the condition is back before its undo could run: the action's effect is still
        # in place, so the target is firing again without acting again
        prev = replace(
            prev,
            status=Status.FIRING,
            retry_at=None,
            repeats=prev.repeats + 1,  # the next clear is a new decision, with a new id
            fired_at=prev.fired_at or now,
            last_fire_at=prev.last_fire_at or now,  # repeat_interval goes on from here
            held=None,  # the undo's suppression is not the fire's
            held_since=None,
            held_repeats=0,
        )
    current = _observe(prev, target, sample, now, max_gap_s)
    current, decision = _advance(policy, target, current, now)
    return target.key, current, decision


def _timer_due(policy: Policy, quiet: Quiet, now: float) -> bool:
    """Whether a timer of a state with ``quiet`` may be due at ``now``."""
    repeat = policy.repeat_interval_s
    return not (
        now - quiet.pending_since < policy.for_s
        and now < quiet.retry_at
        and (repeat is None or now - quiet.last_fire_at < repeat)
    )


def _due(policy: Policy, state: PolicyState, now: float) -> tuple[Quiet, frozenset[str]] | None:
    """The precondition of the steady and churn paths: None unless ``state`` is ``Quiet``
    for the policy's ``for``; else its ``Quiet`` and the targets whose timer is due at
    ``now`` (a pending one reaching ``for``, a firing one whose held-back fire's retry time
    has come or whose ``repeat_interval`` has passed). When the bound says no timer can be
    due, no target is looked at; else one pass over the base (``seen`` moves no timer)
    finds them, and the ``Quiet`` handed back is the exact one of the other targets."""
    quiet = state.quiet
    if quiet is None or quiet.for_s != policy.for_s:
        return None
    if not _timer_due(policy, quiet, now):
        return quiet, frozenset()
    for_s, repeat = policy.for_s, policy.repeat_interval_s
    known = quiet.pending
    if (
        known is not None
        and now < quiet.retry_at
        and (repeat is None or now - quiet.last_fire_at < repeat)
    ):  # only a pending start can be due: those alone
        base = state.base
        rest = {k: t for k, t in known.items() if now - t < for_s}
        due_keys = []
        for key in known.keys() - rest.keys():
            t = base.get(key)
            if t is not None and t.status is Status.PENDING:
                if now - t.active_since >= for_s:
                    due_keys.append(key)
                else:  # pragma: no cover (the start kept is the target's)
                    rest[key] = t.active_since
        since = min(rest.values(), default=inf)
        return Quiet(for_s, since, quiet.retry_at, quiet.last_fire_at, rest), frozenset(due_keys)
    due: list[str] = []
    pending: dict[str, float] = {}
    since = retry = last = inf
    for key, t in state.base.items():
        if t.absent_since is not None:
            return None  # not quiet (``_quiet``): cannot be
        if t.status is Status.PENDING:
            if now - t.active_since >= for_s:
                due.append(key)
                continue
            pending[key] = t.active_since
            if t.active_since < since:
                since = t.active_since
        elif t.status is Status.FIRING:
            if (t.retry_at is not None and now >= t.retry_at) or (
                repeat is not None and t.last_fire_at is not None and now - t.last_fire_at >= repeat
            ):
                due.append(key)
                continue
            if t.last_fire_at is not None and t.last_fire_at < last:
                last = t.last_fire_at
        else:
            return None
        if t.retry_at is not None and t.retry_at < retry:
            retry = t.retry_at
    return Quiet(for_s, since, retry, last, pending), frozenset(due)


def _steady(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    due: tuple[Quiet, frozenset[str]] | None,
    now: float,
) -> Step | None:
    """``evaluate``'s result when it can be had without looking at each target (else None):
    the state is ``Quiet`` and no timer is due at ``now`` (``due``: ``_due``'s), the answer holds
    exactly its targets, once each, none of them in the ``clear_expr`` answer. Then every
    target is seen again, as ``_seen_again`` would make it, and nothing is decided: the next
    state shares the base and carries the new values (``PolicyState.seen``). The keys are
    made in C (``Vector.target_keys``) and compared with the base's, in its order, in C;
    nothing is built or kept per target. An answer in another order takes the general path,
    which orders the state as the answer came."""
    samples = result.samples
    if due is None or due[1] or not isinstance(samples, Vector):
        return None
    quiet = due[0]
    keys = samples.target_keys(policy.target)
    base = state.base
    if keys is None or len(keys) != len(base):
        return None
    if keys != list(base):
        # Only an answer in the base's order (as a steady one is) keeps it: the general path
        # orders the state as the answer came, and the clears of absent targets (judged in
        # that order, each seeing the budget used before it) must come out in the same order
        # whichever path ran (review of issue 15: the live engine and the what-if differed).
        return None
    values = samples.values  # the column itself
    clear = result.clear_samples
    if clear is not None and clear:
        cleared = clear.target_keys(policy.target) if isinstance(clear, Vector) else None
        if cleared is None:
            cleared = list(_by_key(policy, clear))
        if not base.keys().isdisjoint(cleared):
            return None
    return Step((), PolicyState(base, seen=values, seen_at=now, quiet=quiet))


def _delta(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    quiet: Quiet,
    due: frozenset[str],
    now: float,
) -> Step | None:
    """``evaluate``'s result, as the general path makes it, at a cost in proportion to the
    targets that changed or whose timer is due (issue 15, "With churn"), or None. It runs
    where ``_steady`` would but the answer's keys differ from the base's or a timer is due:
    the state is ``Quiet`` (``quiet``: every target pending or firing, none absent; ``due``:
    the targets whose timer is due at ``now``, from ``_due``), the answer holds each target
    once. Then a target in both the base and the answer, not cleared and not due, is seen
    again with no decision (its ``TargetState`` shared, its value in ``PolicyState.seen``);
    a new one, a firing one in the ``clear_expr`` answer and a due one go through the state
    machine as on the general path (``_target_step``: pending from ``now``, or fired at
    once under ``for: 0``; cleared; fired, fired again after its retry time or its
    ``repeat_interval``), their decisions in the answer's order, then those of the firing
    targets gone from the answer under ``keep_firing_for: 0`` or in the ``clear_expr``
    answer (cleared, in the base's order), as the general path decides them; a pending one
    gone is dropped. A firing target gone from the answer and kept (by hysteresis, or a
    ``keep_firing_for``: absent) takes the general path. The new ``Quiet`` is a bound: the
    ``pending_since``, ``retry_at`` and ``last_fire_at`` of targets that went are kept (no
    later than the exact ones); ``_due`` looks for the exact ones (one pass over the
    targets) only when the bound says a timer is due, else the evaluation ``for`` after a
    dropped target took the general path (review: every other churn round did)."""
    samples = result.samples
    base = state.base
    if not base or not isinstance(samples, Vector):
        return None
    index = samples.key_index(policy.target)  # shared by the policies of this answer
    keys = samples.target_keys(policy.target)
    if index is None or keys is None:
        return None  # a target with several series (the general path keeps the first), or
        # keys not made in C
    present = index.keys()
    known = base.keys()
    gone = known - present
    added = present - known
    clear = result.clear_samples
    cleared: set[str] = set()
    if clear is not None and clear:
        clear_keys = clear.target_keys(policy.target) if isinstance(clear, Vector) else None
        cleared = set(clear_keys if clear_keys is not None else _by_key(policy, clear))
        # a pending target ignores clear_expr; a firing one clears
        cleared = {k for k in cleared & known if base[k].status is Status.FIRING}
    absent = [k for k in gone if base[k].status is not Status.PENDING]
    if policy.clear_expr is not None:
        if any(k not in cleared for k in absent):
            return None  # a firing target kept by hysteresis while absent: the general path
    elif absent and policy.keep_firing_for_s > 0:
        return None  # a firing target kept for keep_firing_for while absent: the general path
    timers = due & present  # a due target gone: dropped (pending) or as any absent one
    if not gone and not added and not cleared and not timers:
        return None  # the same targets in another order: the general path orders them
    dropped = cleared - gone  # firing, in the answer and in the clear_expr answer
    touched = added | dropped | timers  # through the state machine, in the answer's order
    rows = sorted(map(index.__getitem__, touched))
    if added:
        keys = list(keys)  # the answer's column stays as it is (new keys interned below)
    decisions: list[Decision] = []
    changed: dict[int, TargetState | None] = {}
    since, retry, last = quiet.pending_since, quiet.retry_at, quiet.last_fire_at
    started: dict[str, float] = {}  # the touched targets pending now (new ones)
    exact = True  # every touched target pending or firing, present: ``Quiet`` holds
    cleared_or = cleared.__contains__
    for i in rows:
        key = keys[i]
        sample = samples[i]
        key, current, decision = _target_step(
            policy, key, base.get(key), sample, cleared_or(key), now, inf
        )
        keys[i] = key  # interned when new (``Target.from_labels``)
        if decision is not None:
            decisions.append(decision)
        changed[i] = current
        if current is None:
            continue
        if current.absent_since is not None:
            exact = False
        if current.status is Status.PENDING:
            since = min(since, current.active_since)
            started[key] = current.active_since
        elif current.status is Status.FIRING:
            if current.last_fire_at is not None:
                last = min(last, current.last_fire_at)
        else:
            exact = False
        if current.retry_at is not None:
            retry = min(retry, current.retry_at)
    if absent:  # each clears now (in clear_expr's answer, or keep_firing_for 0)
        # in the base's order, picked in C (a loop over the base was ~1 ms a policy a round)
        flags = list(map(set(absent).__contains__, base))
        leaving = list(compress(base, flags))
        seen = state.seen  # the value last seen, as merged
        last_seen: Iterable[float | None] = (
            compress(seen, flags) if seen else (base[k].value for k in leaving)
        )
        for key, value in zip(leaving, last_seen, strict=True):
            prev = base[key]
            decisions.append(
                _decide(policy, Target(key, prev.labels), prev, Transition.CLEAR, now, value)
            )
    values: Sequence[float] = samples.values
    ordered: list[str] = keys
    states: list[TargetState | None] = list(map(base.get, keys))
    for i, current in changed.items():
        states[i] = current
    out = [i for i, t in changed.items() if t is None]  # cleared (only clears have none)
    if out:  # out of the state, their values out of ``seen`` (a copy: the answer's column)
        ordered, values = list(keys), list(values)
        for i in sorted(out, reverse=True):
            del ordered[i], values[i], states[i]
    # frozen as ``freeze`` does, without its second copy of the dict
    targets: Mapping[str, Any] = MappingProxyType(dict(zip(ordered, states, strict=True)))
    pending = quiet.pending
    if started and pending is not None:
        pending = {**pending, **started}
    return Step(
        tuple(decisions),
        PolicyState(
            targets,
            seen=values,
            seen_at=now,
            quiet=Quiet(policy.for_s, since, retry, last, pending) if exact else None,
            parent=Delta(base, frozenset(gone | added | dropped | timers)),
        ),
    )


def _quiet(targets: Mapping[str, TargetState], for_s: float) -> Quiet | None:
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
    return Quiet(for_s, since, retry, last, pending)


def _no_data(
    policy: Policy, error: str, state: PolicyState, now: float, reason: str = "query failed"
) -> Step:
    """A failed query (or stale data) acts on nothing. ``hold`` keeps every timer (a pending one
    until ``Freshness.max_gap_s``, see ``_observe``); ``skip`` drops pending ones (the condition
    must then be seen continuously again for the whole ``for``)."""
    if policy.on_no_data == "skip":
        kept = {k: t for k, t in state.targets.items() if t.status is not Status.PENDING}
        state = PolicyState(freeze(kept))
    elif any(t.status is Status.PENDING and t.absent_since is None for t in state.targets.values()):
        state = PolicyState(  # where the stretch without fresh data began (Freshness.max_gap_s)
            freeze(
                {
                    k: replace(t, absent_since=now)
                    if t.status is Status.PENDING and t.absent_since is None
                    else t
                    for k, t in state.targets.items()
                }
            )
        )
    return Step((), state, SkippedEvaluation(policy.name, policy.group, now, error, reason))


def _observe(
    prev: TargetState | None, target: Target, sample: Sample, now: float, max_gap_s: float
) -> TargetState:
    if (
        prev is not None
        and prev.status is Status.PENDING
        and prev.absent_since is not None
        and now - prev.absent_since > max_gap_s
    ):
        prev = None  # no fresh data for too long (an outage): `for` counts from now
    if prev is None:
        return TargetState(Status.PENDING, now, now, sample.value, target.labels)
    return _seen_again(prev, now, sample.value)


def _seen_again(prev: TargetState, now: float, value: float) -> TargetState:
    """``replace(prev, last_seen=now, value=value, absent_since=None)``, without its cost
    (``dataclasses.replace`` re-runs ``__init__`` with every field; this is every target of
    every evaluation): a copy of ``prev``'s fields with the three set."""
    seen = object.__new__(TargetState)
    fields = seen.__dict__
    fields.update(prev.__dict__)
    fields["last_seen"] = now
    fields["value"] = value
    fields["absent_since"] = None
    return seen


def _with(prev: TargetState, **changes: object) -> TargetState:
    """``replace(prev, **changes)`` without re-running ``__init__`` (a decision's target in
    the hot path: ``_advance``, ``settle_all``), as ``_seen_again`` copies."""
    new = object.__new__(TargetState)
    fields = new.__dict__
    fields.update(prev.__dict__)
    fields.update(changes)
    return new


def _observed(prev: TargetState, last_seen: float, value: float) -> TargetState:
    """``prev`` with ``last_seen`` and ``value`` set (``PolicyState.seen``), as ``_seen_again``
    copies."""
    seen = object.__new__(TargetState)
    fields = seen.__dict__
    fields.update(prev.__dict__)
    fields["last_seen"] = last_seen
    fields["value"] = value
    return seen


def _advance(
    policy: Policy, target: Target, current: TargetState, now: float
) -> tuple[TargetState, Decision | None]:
    if current.status is Status.PENDING:
        if now - current.active_since < policy.for_s:
            return current, None
        current = _with(current, status=Status.FIRING, fired_at=now, last_fire_at=now)
        return current, _decide(policy, target, current, Transition.FIRE, now, current.value)
    held_back = current.retry_at is not None and now >= current.retry_at
    if held_back or (
        policy.repeat_interval_s is not None
        and current.last_fire_at is not None
        and now - current.last_fire_at >= policy.repeat_interval_s
    ):
        current = _with(current, last_fire_at=now, repeats=current.repeats + 1, retry_at=None)
        return current, _decide(policy, target, current, Transition.FIRE, now, current.value)
    return current, None


def _decide(
    policy: Policy,
    target: Target,
    state: TargetState,
    transition: Transition,
    now: float,
    value: float | None,
) -> Decision:
    fire = transition is Transition.FIRE
    # undo only what was done: a fire held back, denied or awaiting approval has nothing to undo
    action = policy.action if fire else (policy.on_clear if state.acted else None)
    repeat = state.repeats
    return Decision(
        id=decision_id(policy.name, target.key, state.active_since, transition.value, repeat),
        policy=policy.name,
        group=policy.group,
        target=target,
        transition=transition,
        action=action,
        evidence=Evidence(
            expr=(policy.expr or "") if fire else (policy.clear_expr or policy.expr or ""),
            value=value,
            pending_since=state.active_since,
            observed_at=now,
        ),
        at=now,
        episode_start=state.active_since,
        repeat=repeat,
        mode=policy.mode,
        labels=policy.labels,
        annotations=MappingProxyType(  # ``freeze``: the dict is this one's
            {k: _render(v, target.labels, value) for k, v in policy.annotations.items()}
        ),
        reason=_reason(policy, transition, state, now),
    )


@lru_cache(maxsize=4096)
def _pieces(template: str) -> tuple[str, ...]:
    """``template`` cut at ``render``'s placeholders: text, then for each placeholder its
    ``PLACEHOLDER`` groups (``value``, None; or ``labels.x``, ``x``) and the text after it."""
    return tuple(PLACEHOLDER.split(template))


def _render(template: str, labels: Mapping[str, str], value: float | None) -> str:
    """``render(template, labels, value)``, the template cut once (``_pieces``), not matched
    again by a regular expression at every decision (issue 15: each decision renders its
    policy's annotations)."""
    pieces = _pieces(template)
    if len(pieces) == 1:
        return template
    out = [pieces[0]]
    for n in range(1, len(pieces), 3):
        name = pieces[n + 1]
        if name is None:  # $value
            out.append("" if value is None else f"{value:g}")
        else:
            out.append(labels.get(name, ""))
        out.append(pieces[n + 2])
    return "".join(out)


def _reason(policy: Policy, transition: Transition, state: TargetState, now: float) -> str:
    if transition is Transition.FIRE:
        if state.repeats:
            return f"still firing (decision {state.repeats + 1} of this episode)"
        return f"condition held for {now - state.active_since:.0f}s (for: {policy.for_s:.0f}s)"
    if state.status is Status.CLEARING:
        return "cleared earlier; its undo was held back and is tried again"
    if policy.on_clear is not None and not state.acted:
        return "target cleared; nothing to undo (the action did not run)"
    if policy.clear_expr is not None:
        return "clear_expr matched"
    return "target left the result"


def evaluate_alert(
    policy: Policy, labels: Mapping[str, str], firing: bool, episode_start: float, now: float
) -> Decision | None:
    """The decision of an Alertmanager-triggered policy about one alert; None unless the alert
    carries all the policy's ``trigger.alertmanager`` labels, or is the policy's own alert
    exported by ``gpuops rules export`` (label ``gpuops_policy``). ``episode_start`` (the alert's
    ``startsAt``) makes the id stable: a retried webhook yields the same decision."""
    match = policy.trigger_alertmanager
    exported = labels.get("gpuops_policy") == policy.name  # from `gpuops rules export`
    if not exported and (not match or any(labels.get(k) != v for k, v in match.items())):
        return None
    target = Target.from_labels(labels, policy.target)
    transition = Transition.FIRE if firing else Transition.RESOLVE
    name = labels.get("alertname", "?")
    return Decision(
        id=decision_id(policy.name, target.key, episode_start, transition.value),
        policy=policy.name,
        group=policy.group,
        target=target,
        transition=transition,
        action=policy.action if firing else policy.on_clear,
        evidence=Evidence(
            expr=f"alertmanager: {name}", value=None, pending_since=episode_start, observed_at=now
        ),
        at=now,
        episode_start=episode_start,
        mode=policy.mode,
        labels=policy.labels,
        annotations=freeze({k: render(v, labels, None) for k, v in policy.annotations.items()}),
        reason=f"alert {name} {'firing' if firing else 'resolved'}",
    )


@dataclass(frozen=True)
class Settled:
    """What ``settle`` hands back: the next state, the decisions (a recorded one after a run
    of unrecorded repeats carries their count in ``held_repeats``) and the ids of those that
    only repeat the suppression already recorded for their target (counted, not recorded)."""

    state: PolicyState
    decisions: tuple[Decision, ...]
    repeats: frozenset[str] = frozenset()


def settle(
    state: PolicyState,
    judged: Iterable[Decision],
    retry_at: Callable[[Decision], float],
) -> PolicyState:
    """The next state of ``settle_all``."""
    return settle_all(state, judged, retry_at).state


def settle_all(
    state: PolicyState,
    judged: Iterable[Decision],
    retry_at: Callable[[Decision], float],
) -> Settled:
    """Feed the guardrails' verdicts back into the state: an executed (or dry-run) fire marks
    its target as acted on; a suppressed fire or a suppressed undo is decided again at
    ``retry_at(decision)`` while the target stays in the same state. A suppressed fire whose
    target is already held with the same verdict is a repeat: counted in the target's state,
    not recorded again; the next recorded decision of the target carries the count."""
    judged = list(judged)
    if not judged:  # the steady case: the state as it is (not copied: ``PolicyState.seen``)
        return Settled(state, ())
    targets: dict[str, TargetState] | _Touched = (
        _Touched(state) if state.seen else dict(state.targets)
    )
    out: list[Decision] = []
    repeats: set[str] = set()
    for decision in judged:
        key = decision.target.key
        current = targets.get(key)
        held = decision.suppressed and decision.action is not None
        if decision.transition is Transition.FIRE and current is not None:
            if held and current.held == decision.verdict:
                repeats.add(decision.id)
                targets[key] = _with(
                    current, retry_at=retry_at(decision), held_repeats=current.held_repeats + 1
                )
                out.append(decision)
                continue
            if current.held is not None:  # the suppression ends or its reason changes
                decision = decision.but(held_repeats=current.held_repeats)
            if decision.verdict in (Verdict.EXECUTE.value, Verdict.DRY_RUN.value):
                ran = 1 if decision.action is not None else 0
                targets[key] = _unheld(_with(current, actions=current.actions + ran))
            elif held:
                targets[key] = _with(
                    current,
                    retry_at=retry_at(decision),
                    held=decision.verdict,
                    held_since=decision.at,
                    held_repeats=0,
                )
            else:
                targets[key] = _unheld(current)
        elif decision.transition is not Transition.FIRE:
            retrying = current is not None and current.status is Status.CLEARING
            if held and retrying and current is not None and current.held == decision.verdict:
                repeats.add(decision.id)  # the undo is still held back for the same reason
                targets[key] = _with(
                    current, retry_at=retry_at(decision), held_repeats=current.held_repeats + 1
                )
                out.append(decision)
                continue
            if retrying and current is not None and current.held is not None:
                decision = decision.but(held_repeats=current.held_repeats)
            if held:  # an undo that did not run: tried again
                targets[key] = replace(
                    _clearing(decision, retry_at(decision)),
                    held=decision.verdict,
                    held_since=decision.at,
                )
            elif retrying:
                del targets[key]  # the undo runs (or has nothing to run): the episode ends
        out.append(decision)
    # ``Quiet`` again when the evaluation's was (its ``for``): the next evaluation may take
    # the steady path at once, not the general one for every target (issue 15: the round
    # after a fire cost 3x a steady one)
    if isinstance(targets, _Touched):
        return Settled(targets.settled(), tuple(out), frozenset(repeats))
    quiet = _quiet(targets, state.quiet.for_s) if state.quiet is not None else None
    return Settled(PolicyState(freeze(targets), quiet=quiet), tuple(out), frozenset(repeats))


_KEEP = object()


class _Touched:
    """``settle_all``'s targets over a state seen again (``PolicyState.seen``: from the
    steady or churn path) without merging every target: the decided ones are read merged,
    their changes kept apart (``changes``: a base target replaced, None: removed; ``extra``:
    targets not in the base, or removed and set again, in the order a dict would hold them),
    and ``settled`` builds the next state with the untouched targets still shared."""

    def __init__(self, state: PolicyState) -> None:
        self.state = state
        self.changes: dict[str, TargetState | None] = {}
        self.extra: dict[str, TargetState] = {}
        self._at: dict[str, int] | None = None

    def _value(self, key: str) -> float:
        if self._at is None:
            base = self.state.base
            self._at = dict(zip(base, range(len(base)), strict=True))
        return self.state.seen[self._at[key]]

    def get(self, key: str) -> TargetState | None:
        if key in self.extra:
            return self.extra[key]
        if key in self.changes:
            return self.changes[key]
        t = self.state.base.get(key)
        return None if t is None else _observed(t, self.state.seen_at, self._value(key))

    def _in_base(self, key: str) -> bool:
        return key in self.state.base and self.changes.get(key, _KEEP) is not None

    def __setitem__(self, key: str, value: TargetState) -> None:
        if key not in self.extra and self._in_base(key):
            self.changes[key] = value
        else:
            self.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self.extra:
            del self.extra[key]
        elif self._in_base(key):
            self.changes[key] = None
        else:
            raise KeyError(key)

    def settled(self) -> PolicyState:
        """The next state: what ``dict(state.targets)`` with the same changes would hold,
        sharing the untouched targets (``Delta``: the store writes the touched ones)."""
        state = self.state
        base, at = state.base, state.seen_at
        targets = dict(base)
        shared = True  # every changed target seen at ``at`` with its ``seen`` value
        for key, t in self.changes.items():
            if t is None:
                del targets[key]
            else:
                targets[key] = t
                v = self._value(key)
                shared = shared and t.last_seen == at and (t.value == v or t.value is v)
        targets.update(self.extra)
        shared = shared and all(
            t.last_seen == at and t.value is not None for t in self.extra.values()
        )
        if not shared:  # merged, as the dict path makes it
            merged = dict(state.targets)
            for key, t in self.changes.items():
                if t is None:
                    del merged[key]
                else:
                    merged[key] = t
            merged.update(self.extra)
            quiet = _quiet(merged, state.quiet.for_s) if state.quiet is not None else None
            return PolicyState(freeze(merged), quiet=quiet)
        gone = {k for k, t in self.changes.items() if t is None}
        values = (
            [v for k, v in zip(base, state.seen, strict=True) if k not in gone]
            if gone
            else list(state.seen)
        )
        values += [t.value for t in self.extra.values() if t.value is not None]  # all of them
        touched = [t for t in self.changes.values() if t is not None] + list(self.extra.values())
        quiet = state.quiet
        if quiet is not None:
            since, retry, last = quiet.pending_since, quiet.retry_at, quiet.last_fire_at
            pending = quiet.pending
            for t in touched:
                if t.absent_since is not None or t.status is Status.CLEARING:
                    quiet = None
                    break
                if t.status is Status.PENDING:
                    pending = None  # not settle's (a decision's target fires or clears)
                    since = min(since, t.active_since)
                if t.retry_at is not None and t.retry_at < retry:
                    retry = t.retry_at
                if t.last_fire_at is not None and t.last_fire_at < last:
                    last = t.last_fire_at
            else:
                quiet = Quiet(quiet.for_s, since, retry, last, pending)
        parent = state.parent
        keys = set(self.changes) | set(self.extra)
        return PolicyState(
            MappingProxyType(targets),  # ``freeze`` without its copy: the dict is this one's
            seen=values,
            seen_at=at,
            quiet=quiet,
            parent=Delta(
                parent.base if parent is not None else base,
                frozenset(keys | parent.keys if parent is not None else keys),
            ),
        )


def _unheld(state: TargetState) -> TargetState:
    return _with(state, held=None, held_since=None, held_repeats=0)


def failed(
    state: PolicyState,
    decision: Decision,
    retry_at: float | None,
    held: Verdict | None = None,
) -> PolicyState:
    """The state after ``decision``'s action failed (its executor gave up) or the gate held it:
    a fire is decided again at ``retry_at`` while its target still fires, and it has not acted;
    a failed undo is retried like one the guardrails held back. ``retry_at`` None (a permanent
    failure): not decided again within the episode. ``held``: the verdict that held a fire at
    the gate, recorded on its target (``TargetState.held``) with the time it was held."""
    targets = dict(state.targets)
    current = targets.get(decision.target.key)
    if decision.transition is Transition.FIRE:
        if current is None or current.status is not Status.FIRING:
            return state
        actions = max(0, current.actions - 1)  # an earlier action of the episode may have run
        marks: dict[str, Any] = {}
        if held is not None:
            marks = {"held": held.value, "held_since": decision.at, "held_repeats": 0}
        targets[decision.target.key] = replace(current, actions=actions, retry_at=retry_at, **marks)
    elif decision.transition is Transition.CLEAR and current is None and retry_at is not None:
        targets[decision.target.key] = _clearing(decision, retry_at)
    else:
        return state
    return PolicyState(freeze(targets))


def _clearing(decision: Decision, retry_at: float) -> TargetState:
    """The state of a target whose undo (``decision``) did not run and is tried again."""
    return TargetState(
        Status.CLEARING,
        active_since=decision.episode_start,
        last_seen=decision.at,
        value=decision.evidence.value,
        labels=decision.target.labels,
        actions=1,
        retry_at=retry_at,
        repeats=decision.repeat,
    )
