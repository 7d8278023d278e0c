"""The evaluation's fast paths: ``steady`` (every target seen again, nothing due: nothing is
built per target) and ``churn`` (some targets come, go or are due: a cost in proportion to
them), with ``due``, which finds the targets whose timer is due.

Called by ``gpuops.model.evaluation.evaluator.evaluate`` before its general path; each gives
exactly what the general path would, or None where it cannot (the general path runs then).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from math import inf
from types import MappingProxyType
from typing import Any

from gpuops.model.decisions import Decision, Target, Transition, Vector
from gpuops.model.evaluation.machine import by_key, decide, target_step
from gpuops.model.evaluation.state import Delta, PolicyState, Quiet, Status, TargetState
from gpuops.model.evaluation.step import QueryResult, Step
from gpuops.model.rules.model import Policy


def _timer_due(policy: Policy, quiet: Quiet, now: float) -> bool:
    """Whether a timer of a state with ``quiet`` may be due at ``now``."""
    repeat = policy.repeat_interval_s
    return not (
        now - quiet.pending_since < policy.for_s
        and now < quiet.retry_at
        and (repeat is None or now - quiet.last_fire_at < repeat)
    )


def due(policy: Policy, state: PolicyState, now: float) -> tuple[Quiet, frozenset[str]] | None:
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
    found: list[str] = []
    pending: dict[str, float] = {}
    since = retry = last = inf
    for key, t in state.base.items():
        if t.absent_since is not None:
            return None  # not quiet (``Quiet.of``): cannot be
        if t.status is Status.PENDING:
            if now - t.active_since >= for_s:
                found.append(key)
                continue
            pending[key] = t.active_since
            if t.active_since < since:
                since = t.active_since
        elif t.status is Status.FIRING:
            if (t.retry_at is not None and now >= t.retry_at) or (
                repeat is not None and t.last_fire_at is not None and now - t.last_fire_at >= repeat
            ):
                found.append(key)
                continue
            if t.last_fire_at is not None and t.last_fire_at < last:
                last = t.last_fire_at
        else:
            return None
        if t.retry_at is not None and t.retry_at < retry:
            retry = t.retry_at
    return Quiet(for_s, since, retry, last, pending), frozenset(found)


def steady(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    found: tuple[Quiet, frozenset[str]] | None,
    now: float,
) -> Step | None:
    """``evaluate``'s result when it can be had without looking at each target (else None):
    the state is ``Quiet`` and no timer is due at ``now`` (``found``: ``due``'s), the answer holds
    exactly its targets, once each, none of them in the ``clear_expr`` answer. Then every
    target is seen again, as ``TargetState.seen_again`` would make it, and nothing is decided:
    the next state shares the base and carries the new values (``PolicyState.seen``). The keys
    are made in C (``Vector.target_keys``) and compared with the base's, in its order, in C;
    nothing is built or kept per target. An answer in another order takes the general path,
    which orders the state as the answer came."""
    samples = result.samples
    if found is None or found[1] or not isinstance(samples, Vector):
        return None
    quiet = found[0]
    keys = samples.target_keys(policy.target)
    base = state.base
    if keys is None or len(keys) != len(base):
        return None
    if keys != list(base):
        # Only an answer in the base's order (as a steady one is) keeps it: the general path
        # orders the state as the answer came, and the clears of absent targets (judged in
        # that order, each seeing the budget used before it) must come out in the same order
        # whichever path ran (the live engine and the what-if must agree).
        return None
    values = samples.values  # the column itself
    clear = result.clear_samples
    if clear is not None and clear:
        cleared = clear.target_keys(policy.target) if isinstance(clear, Vector) else None
        if cleared is None:
            cleared = list(by_key(policy, clear))
        if not base.keys().isdisjoint(cleared):
            return None
    return Step((), PolicyState(base, seen=values, seen_at=now, quiet=quiet))


def churn(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    quiet: Quiet,
    timed: frozenset[str],
    now: float,
) -> Step | None:
    """``evaluate``'s result, as the general path makes it, at a cost in proportion to the
    targets that changed or whose timer is due, or None. It runs where ``steady`` would but
    the answer's keys differ from the base's or a timer is due: the state is ``Quiet``
    (``quiet``: every target pending or firing, none absent; ``timed``: the targets whose timer
    is due at ``now``, from ``due``), the answer holds each target once. Then a target in
    both the base and the answer, not cleared and not due, is seen again with no decision
    (its ``TargetState`` shared, its value in ``PolicyState.seen``); a new one, a firing one
    in the ``clear_expr`` answer and a due one go through the state machine as on the
    general path (``machine.target_step``: pending from ``now``, or fired at once under
    ``for: 0``; cleared; fired, fired again after its retry time or its
    ``repeat_interval``), their decisions in the answer's order, then those of the firing
    targets gone from the answer under ``keep_firing_for: 0`` or in the ``clear_expr``
    answer (cleared, in the base's order), as the general path decides them; a pending one
    gone is dropped. A firing target gone from the answer and kept (by hysteresis, or a
    ``keep_firing_for``: absent) takes the general path. The new ``Quiet`` is a bound: the
    ``pending_since``, ``retry_at`` and ``last_fire_at`` of targets that went are kept (no
    later than the exact ones); ``due`` looks for the exact ones (one pass over the targets)
    only when the bound says a timer is due, so that the evaluation ``for`` after a dropped
    target does not take the general path."""
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
        cleared = set(clear_keys if clear_keys is not None else by_key(policy, clear))
        # a pending target ignores clear_expr; a firing one clears
        cleared = {k for k in cleared & known if base[k].status is Status.FIRING}
    absent = [k for k in gone if base[k].status is not Status.PENDING]
    if policy.clear_expr is not None:
        if any(k not in cleared for k in absent):
            return None  # a firing target kept by hysteresis while absent: the general path
    elif absent and policy.keep_firing_for_s > 0:
        return None  # a firing target kept for keep_firing_for while absent: the general path
    timers = timed & present  # a due target gone: dropped (pending) or as any absent one
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
        key, current, decision = target_step(
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
        # in the base's order, picked in C (a loop over the base costs ~1 ms a policy)
        flags = list(map(set(absent).__contains__, base))
        leaving = list(compress(base, flags))
        seen = state.seen  # the value last seen, as merged
        last_seen: Iterable[float | None] = (
            compress(seen, flags) if seen else (base[k].value for k in leaving)
        )
        for key, value in zip(leaving, last_seen, strict=True):
            prev = base[key]
            decisions.append(
                decide(policy, Target(key, prev.labels), prev, Transition.CLEAR, now, value)
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
