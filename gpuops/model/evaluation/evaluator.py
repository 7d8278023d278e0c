"""Pure evaluation of one policy: (policy, query result, previous state, now) → (decisions, state).

``evaluate`` tries the fast paths first (``fastpath``: nothing due and every target seen
again, or a few targets changed), holds what has no fresh data (``stale``: a failed query, or
stale input series, whose targets are held; a pending timer does not run across a gap without
fresh data longer than ``Freshness.max_gap_s``, docs/policies.md), and else takes the general
path here, one target at a time through the state machine (``machine``). No I/O, no clock, no
globals: the live loop (``gpuops.runtime``) and backtests all call ``evaluate`` unchanged; the
guardrails (``gpuops.model.guardrails``) judge its decisions afterwards.
"""

from __future__ import annotations

from dataclasses import replace

from gpuops.model.decisions import Decision, Target, Transition, freeze
from gpuops.model.evaluation.fastpath import churn as _churn
from gpuops.model.evaluation.fastpath import due as _due
from gpuops.model.evaluation.fastpath import steady as _steady
from gpuops.model.evaluation.machine import advance, by_key, decide, target_step
from gpuops.model.evaluation.stale import around_stale, no_data
from gpuops.model.evaluation.state import PolicyState, Quiet, Status, TargetState
from gpuops.model.evaluation.step import Freshness, QueryResult, Step
from gpuops.model.rules.model import Policy

# The fast paths are module names here (``_steady``...): a test spies on which path ran.


def evaluate(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    now: float,
    freshness: Freshness = Freshness(),  # noqa: B008 (frozen)
) -> Step:
    """Advance ``policy``'s state machine to ``now`` with ``result``."""
    if result.error is not None:
        return no_data(policy, result.error, state, now)
    if result.stale:
        return around_stale(policy, result, state, now, freshness, evaluate)
    due = _due(policy, state, now)
    steady = _steady(policy, result, state, due, now)
    if steady is not None:
        return steady
    churn = _churn(policy, result, state, *due, now) if due is not None else None
    if churn is not None:
        return churn

    matched = by_key(policy, result.samples)
    cleared = (
        by_key(policy, result.clear_samples).keys()
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
                current = prev.seen_again(now, sample.value)
                if now - current.active_since >= policy.for_s:
                    current, decision = advance(policy, Target(key, prev.labels), current, now)
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
            targets[key] = prev.seen_again(now, sample.value)  # firing on, nothing to decide
            continue
        key, next_state, decision = target_step(
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
                decisions.append(decide(policy, target, retry, Transition.CLEAR, now, prev.value))
                targets[key] = retry  # ``settle_all`` drops it once the undo may run
            else:
                targets[key] = prev
            continue
        if policy.clear_expr is not None:
            if key in cleared:
                decisions.append(decide(policy, target, prev, Transition.CLEAR, now, prev.value))
            else:
                targets[key] = prev  # hysteresis: firing until clear_expr matches
        else:
            absent_since = prev.absent_since if prev.absent_since is not None else now
            if now - absent_since >= policy.keep_firing_for_s:
                decisions.append(decide(policy, target, prev, Transition.CLEAR, now, prev.value))
            else:
                targets[key] = replace(prev, absent_since=absent_since)

    return Step(
        tuple(decisions), PolicyState(freeze(targets), quiet=Quiet.of(targets, policy.for_s))
    )
