"""A policy's ``policy_seen`` row: the ``last_seen`` and ``value`` of all its targets at once,
refreshed every ``REFRESH_S`` or less, so that an evaluation that only sees its targets again
rewrites no target row. Also ``TargetRows``, what ``gpuops.store.sql.policy_states`` knows of
the rows it wrote, and ``changed``, which tells it whether a target's row must be written.

The data of a ``policy_seen`` row is ``[[key, ...], [last_seen, ...] or one last_seen for all,
[value, ...]]``; where newer than a target row's own, its ``last_seen`` and ``value`` are the
target's.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuops.model.evaluation.state import PolicyState, TargetState

REFRESH_S = 300.0
"""A target whose only change is ``last_seen`` and ``value`` (every evaluation of a pending or
firing target) has them stored at most this much later: after a restart the engine knows
each target's ``last_seen`` and ``value`` as they were at most this long before (the
evidence of a clear of a target that left the result); nothing the state machine decides
reads ``last_seen``. That is a bound on how far the store lags, not on the age of a stored
``last_seen``: a firing target kept while absent (hysteresis) and seen again since the last
refresh has the ``last_seen`` of before its absence stored until the next one. They are not
written into the target's row but, for all the policy's targets at once, into its one
``policy_seen`` row (``seen_data``)."""

_MOVING = frozenset({"last_seen", "value"})
"""The fields of a target stored in ``policy_seen`` rather than in its row."""


def refresh_after(policy: str) -> float:
    """How far the evaluation time moves before ``policy``'s ``policy_seen`` row is written
    again: between half of ``REFRESH_S`` and all of it, by the policy's name, so that the
    policies that fired together are not all refreshed in one evaluation."""
    return REFRESH_S * (0.5 + zlib.crc32(policy.encode()) % 16 / 32)


@dataclass
class TargetRows:
    """A policy's targets as its rows hold them (``rows``); ``base``: a ``PolicyState.base``
    whose targets equal the rows but for ``last_seen`` and ``value`` (a state sharing it
    changed nothing else); ``seen_at``: when every target's ``last_seen`` and ``value`` were
    last stored (its rows all written, or the ``policy_seen`` row; inf: not yet)."""

    rows: dict[str, TargetState]
    base: Mapping[str, TargetState] | None
    seen_at: float

    def copy(self) -> TargetRows:
        """A copy to change in a transaction (the cached one stays as committed; ``rows`` is
        copied only when it changes)."""
        return TargetRows(self.rows, self.base, self.seen_at)


def seen_data(state: PolicyState) -> str:
    """The ``policy_seen`` data of ``state``: its keys, their ``last_seen``s (one number when
    they are all the same: a state seen again, ``PolicyState.seen``, whose lists are made in
    C) and values (as ``json.dumps`` writes floats: exact, ``NaN`` and ``Infinity``
    included)."""
    if state.seen:  # every target seen at ``seen_at``: one time for all
        return json.dumps([list(state.base), state.seen_at, list(state.seen)])
    targets = state.targets
    return json.dumps(
        [
            list(targets),
            [t.last_seen for t in targets.values()],
            [t.value for t in targets.values()],
        ]
    )


def overlay(targets: dict[str, TargetState], text: str) -> None:
    """Set the ``last_seen`` and ``value`` of ``targets`` from a ``policy_seen`` row's data
    where it is newer than the row's own (a row written later has its own, newer ones).
    ``ValueError`` or ``TypeError`` when the data is not what ``seen_data`` writes."""
    data = json.loads(text)
    if not isinstance(data, list) or len(data) != 3:
        raise ValueError(f"not [keys, last_seen, values]: {str(data)[:80]!r}")
    keys, times, values = data
    if type(times) in (float, int):  # one time for all (``seen_data`` of a state seen again)
        times = [times] * len(keys) if isinstance(keys, list) else times
    if not (isinstance(keys, list) and isinstance(times, list) and isinstance(values, list)):
        raise ValueError("not [keys, last_seen, values] lists")
    if not len(keys) == len(times) == len(values):
        raise ValueError(f"lists of {len(keys)}, {len(times)} and {len(values)} items")
    for key, at, value in zip(keys, times, values, strict=True):
        if type(key) is not str or type(at) not in (float, int):
            raise TypeError(f"target {key!r:.80}: not a key and a time")
        if value is not None and type(value) not in (float, int):
            raise TypeError(f"target {key!r:.80}: value {value!r:.40} is not a number")
        target = targets.get(key)
        if target is not None and at > target.last_seen:
            targets[key] = replace(target, last_seen=float(at), value=value)


def changed(before: TargetState, after: TargetState) -> bool:
    """Whether ``after``'s row must be written over ``before``'s: a field other than
    ``last_seen`` and ``value`` (``_MOVING``: stored in ``policy_seen``) differs. This runs
    for every target of an evaluation that did not take the steady path."""
    if after is before:
        return False
    old, new = vars(before), dict(vars(after))
    new["last_seen"], new["value"] = old["last_seen"], old["value"]  # ``_MOVING``
    return new != old  # compared in C, identical field values first
