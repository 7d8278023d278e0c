"""Evaluations without fresh data: a failed query holds every target (``no_data``), stale input
series hold the targets they are attributed to while the others are evaluated (``around_stale``).

Neither ever acts. Called by ``gpuops.model.evaluation.evaluator.evaluate``, which hands
``around_stale`` itself to evaluate the targets that are not held; which targets a stale series
holds is ``gpuops.model.staleness``'s to say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpuops.model.decisions import SkippedEvaluation, Target, freeze
from gpuops.model.evaluation.machine import by_key
from gpuops.model.evaluation.state import PolicyState, Quiet, Status
from gpuops.model.evaluation.step import Freshness, QueryResult, Step
from gpuops.model.rules.model import Policy
from gpuops.model.staleness import describe, held_targets

STALE_DATA = "stale data"
"""The reason of an evaluation skipped (wholly or for some targets) on stale input."""

MAX_HELD_NAMED = 10
"""How many held targets a skipped evaluation's message names (the rest are counted)."""

Evaluate = Callable[[Policy, QueryResult, PolicyState, float, Freshness], Step]
"""``evaluate``'s signature: how ``around_stale`` evaluates the targets it does not hold."""


def around_stale(
    policy: Policy,
    result: QueryResult,
    state: PolicyState,
    now: float,
    freshness: Freshness,
    evaluate: Evaluate,
) -> Step:
    """``evaluate`` when some input series are stale: the targets they are attributed to
    (``gpuops.model.staleness.held_targets``: in the answers or in ``state``) are held as on a
    failed query (``no_data``); the others are evaluated on the rest of the answers. The
    skipped evaluation names the held targets (all of them: the whole evaluation skipped)."""
    matched = by_key(policy, result.samples)
    cleared = by_key(policy, result.clear_samples) if result.clear_samples is not None else {}
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
        return no_data(policy, why, state, now, reason=STALE_DATA)
    if not held.keys:  # stale series no target rests on (a GPU that left the result)
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
    targets = {**rest.state.targets, **no_data(policy, why, kept, now).state.targets}
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
        PolicyState(freeze(targets), quiet=Quiet.of(targets, policy.for_s)),
        skipped,
    )


def no_data(
    policy: Policy, error: str, state: PolicyState, now: float, reason: str = "query failed"
) -> Step:
    """A failed query (or stale data) acts on nothing. ``hold`` keeps every timer (a pending one
    until ``Freshness.max_gap_s``, see ``machine.observe``); ``skip`` drops pending ones (the
    condition must then be seen continuously again for the whole ``for``)."""
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
