"""Backtests: run policies over Prometheus history with the same pure evaluation and guardrails
as the live loop, and report what they would have decided (``gpuops backtest run``).

Each policy's ``expr`` (and ``clear_expr``, and the ``max_fraction`` population) is fetched once
as a range query (``gpuops.sources.prometheus.PrometheusClient.query_range``), then stepped through
at
the query's resolution: ``evaluate`` then ``judge_step`` (the live cycle's) at every step,
state carried over. Fresh data only, as live: the stale-series probe of the policy's inputs
(``gpuops.sources.prometheus.stale_expr``) is a range query too, so a target whose exporter stopped
within the history is held at the steps where its samples are older than the bound.
Nothing is executed and nothing is audited. Called by ``gpuops.cli.backtest``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from apscheduler.triggers.cron import CronTrigger

from gpuops.model.decisions import Decision, Sample
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.evaluation.step import Freshness, QueryResult
from gpuops.model.guardrails import Context, GuardrailState, judge_step, population_expr
from gpuops.model.rules.model import Policy
from gpuops.model.staleness import StaleInput
from gpuops.sources import MetricsSource
from gpuops.sources.promql import AGE_LABEL, input_selectors, join_labels, stale_expr


@dataclass(frozen=True)
class PolicyBacktest:
    policy: str
    steps: int
    decisions: tuple[Decision, ...]
    firing_steps: int = 0
    """Steps at which at least one target was firing."""

    def summary(self) -> Counter[str]:
        """Counts by ``transition verdict``, e.g. ``fire execute``, ``fire suppressed:cooldown``."""
        return Counter(f"{d.transition.value} {d.verdict}" for d in self.decisions)


@dataclass(frozen=True)
class Backtest:
    start: float
    end: float
    step_s: float
    results: tuple[PolicyBacktest, ...] = field(default_factory=tuple)


def run_backtest(
    policies: Iterable[Policy],
    client: MetricsSource,
    start: float,
    end: float,
    step_s: float,
    keep_mode: bool = False,
    freshness: Callable[[Policy], Freshness] | None = None,
) -> Backtest:
    """Backtest every policy that has an ``expr`` over [start, end] at ``step_s``.

    ``keep_mode``: judge dry-run policies as dry-run (default: as if enforced, since the point
    of a backtest is what a policy *would* do). ``freshness``: each policy's bounds, as the
    engine's (None: no bound, every sample of the history is acted on)."""
    start = float(math.floor(start))
    results = []
    for policy in policies:
        if policy.expr is None:
            continue
        judged_as = policy if keep_mode else replace(policy, mode="enforce")
        bounds = freshness(policy) if freshness is not None else Freshness()
        results.append(_one(judged_as, client, start, end, step_s, bounds))
    return Backtest(start, end, step_s, tuple(results))


def _one(
    policy: Policy,
    client: MetricsSource,
    start: float,
    end: float,
    step_s: float,
    freshness: Freshness,
) -> PolicyBacktest:
    assert policy.expr is not None
    main = client.query_range(policy.expr, start, end, step_s)
    stale = _stale(policy, client, start, end, step_s, freshness.max_sample_age_s)
    clear = client.query_range(policy.clear_expr, start, end, step_s) if policy.clear_expr else None
    names = {n for samples in main.values() for sample in samples for n in sample.labels}
    pop_expr = population_expr(policy, names)
    population = client.query_range(pop_expr, start, end, step_s) if pop_expr else None
    state = PolicyState()
    guard = GuardrailState()
    decisions: list[Decision] = []
    firing_steps = 0
    steps = int((end - start) // step_s) + 1
    due = _cron_times(policy.schedule, start, end) if policy.schedule else None
    for i in range(steps):
        now = start + i * step_s
        if due is not None and not _fires_within(due, now, now + step_s):
            continue  # a scheduled policy is only evaluated at its cron times, as live
        result = QueryResult(
            main.get(now, ()),
            clear.get(now, ()) if clear is not None and state.firing() else None,
            stale=stale.get(now, ()),
        )
        step = evaluate(policy, result, state, now, freshness)
        state = step.state
        if step.decisions:
            ctx = Context(population=len(population.get(now, ())) if population else None)
            judgement = judge_step(policy, step.decisions, state, guard, ctx, now)
            assert judgement.policy_state is not None
            state, guard = judgement.policy_state, judgement.guardrails
            decisions.extend(judgement.decisions)
        if state.firing():
            firing_steps += 1
    return PolicyBacktest(policy.name, steps, tuple(decisions), firing_steps)


def _stale(
    policy: Policy,
    client: MetricsSource,
    start: float,
    end: float,
    step_s: float,
    bound_s: float,
) -> dict[float, tuple[StaleInput, ...]]:
    """The stale input series of ``policy`` at each step (``gpuops.sources.prometheus.stale_expr``
    as a range query), by step."""
    inputs = tuple(dict.fromkeys(s for e in _exprs(policy) for s in input_selectors(e)))
    probe = stale_expr(inputs, bound_s)
    if probe is None:
        return {}
    found: dict[float, dict[str, list[Sample]]] = {}
    for at, samples in client.query_range(probe, start, end, step_s).items():
        for sample in samples:
            index = int(sample.labels.get(AGE_LABEL, "-1"))
            if 0 <= index < len(inputs):
                found.setdefault(at, {}).setdefault(inputs[index], []).append(sample)
    on, ignoring = join_labels(_exprs(policy))
    return {
        at: tuple(StaleInput(i, tuple(series), on, ignoring) for i, series in by_input.items())
        for at, by_input in found.items()
    }


def _exprs(policy: Policy) -> tuple[str, ...]:
    return tuple(e for e in (policy.expr, policy.clear_expr) if e is not None)


def _cron_times(schedule: str, start: float, end: float) -> list[float]:
    """The times ``schedule`` fires in [start, end] (UTC), ascending."""
    trigger = CronTrigger.from_crontab(schedule, timezone=UTC)
    found: list[float] = []
    previous = None
    at = datetime.fromtimestamp(start, UTC)
    while True:
        fire = trigger.get_next_fire_time(previous, at)
        if fire is None or fire.timestamp() > end:
            return found
        found.append(fire.timestamp())
        previous = fire
        at = fire + timedelta(seconds=1)


def _fires_within(times: list[float], start: float, end: float) -> bool:
    """Whether one of the sorted ``times`` falls in [start, end)."""
    i = bisect_left(times, start)
    return i < len(times) and times[i] < end
