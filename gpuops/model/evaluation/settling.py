"""Settling: the guardrails' verdicts and the gate's outcomes fed back into a policy's state.

``settle_all`` (called by ``gpuops.model.guardrails.judge_step`` with the judged decisions of an
evaluation) marks what ran as acted on and schedules what was held back to be decided again;
``failed`` (called by ``gpuops.runtime.gate``) does the same for an action whose executor gave up
or that the gate held. Repeats of a suppression already recorded for a target are counted, not
recorded again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from gpuops.model.decisions import Decision, Transition, Verdict, freeze
from gpuops.model.evaluation.state import Delta, PolicyState, Quiet, Status, TargetState


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
                targets[key] = current.but(
                    retry_at=retry_at(decision), held_repeats=current.held_repeats + 1
                )
                out.append(decision)
                continue
            if current.held is not None:  # the suppression ends or its reason changes
                decision = decision.but(held_repeats=current.held_repeats)
            if decision.verdict in (Verdict.EXECUTE.value, Verdict.DRY_RUN.value):
                ran = 1 if decision.action is not None else 0
                targets[key] = current.but(actions=current.actions + ran).unheld()
            elif held:
                targets[key] = current.but(
                    retry_at=retry_at(decision),
                    held=decision.verdict,
                    held_since=decision.at,
                    held_repeats=0,
                )
            else:
                targets[key] = current.unheld()
        elif decision.transition is not Transition.FIRE:
            retrying = current is not None and current.status is Status.CLEARING
            if held and retrying and current is not None and current.held == decision.verdict:
                repeats.add(decision.id)  # the undo is still held back for the same reason
                targets[key] = current.but(
                    retry_at=retry_at(decision), held_repeats=current.held_repeats + 1
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
    # the steady path at once, not the general one for every target (the evaluation after a
    # fire would cost three steady ones)
    if isinstance(targets, _Touched):
        return Settled(targets.settled(), tuple(out), frozenset(repeats))
    quiet = Quiet.of(targets, state.quiet.for_s) if state.quiet is not None else None
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
        return None if t is None else t.observed(self.state.seen_at, self._value(key))

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
            quiet = Quiet.of(merged, state.quiet.for_s) if state.quiet is not None else None
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
