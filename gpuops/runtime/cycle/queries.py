"""What the cycle asks Prometheus: a policy's ``expr`` and ``clear_expr``, the input series
they read that are stale (fresh data only: ``gpuops.model.staleness``), and the population
``max_fraction`` divides by — each asked once per query and evaluation time, the answers kept
for the few evaluation times still being evaluated.

Used by ``gpuops.runtime.cycle.cycle.Cycle`` (and, through it, by the gate's recheck at
execution, approvals and the alert inbox for populations); ``age_selectors`` is what a group
run probes first, which the what-if prefetches (``gpuops.sim.whatif``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from gpuops.model.decisions import Decision, Sample
from gpuops.model.evaluation.step import Freshness, QueryResult
from gpuops.model.guardrails import population_expr
from gpuops.model.rules.model import Policy
from gpuops.model.staleness import StaleInput
from gpuops.runtime.metrics import EngineMetrics
from gpuops.sources import MetricsSource, QueryError
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promql import input_selectors, join_labels

log = logging.getLogger(__name__)

POPULATIONS_KEPT = 256
"""Population queries whose count is remembered for their evaluation time (``population``)."""

TIMES_KEPT = 8
"""Evaluation times whose stale input series are remembered."""

CLEARS_KEPT = 2
"""Evaluation times whose ``clear_expr`` results are remembered (a wide one at 50,000 GPUs is
~20,000 samples: kept only for the policies of the group run that asked it)."""

Answers = dict[str, Sequence[Sample]]
"""Answers by query (a group run's, shared by its policies with the same ``expr``)."""

_Ages = dict[tuple[str, float], tuple[Sample, ...]]
"""(input selector, freshness bound) -> its stale series (empty: none)."""

_V = TypeVar("_V")


class Queries:
    """The cycle's questions to Prometheus and the answers kept per evaluation time."""

    def __init__(
        self,
        prometheus: MetricsSource,
        metrics: EngineMetrics,
        freshness: Callable[[Policy], Freshness],
    ) -> None:
        self._prometheus = prometheus
        self._metrics = metrics
        self._freshness = freshness
        self._lock = threading.Lock()
        self._populations: dict[str, tuple[float, int]] = {}  # query -> (evaluation time, count)
        self._ages: dict[float, _Ages] = {}  # evaluation time -> stale series by input
        self._clears: dict[float, Answers] = {}  # evaluation time -> clear query -> answer

    def result(
        self,
        policy: Policy,
        now: float,
        clear_query: str | None,
        answers: Answers | None = None,
    ) -> QueryResult:
        """``policy``'s expr, its ``clear_expr`` while a target fires (``clear_query``: only
        for the firing targets where that is sound, ``gpuops.runtime.cycle.clears``), and the
        input series they read whose newest sample is older than the policy's freshness bound
        (fresh data only). ``answers``: the group run's answers by query, shared by its
        policies with the same ``expr``."""
        assert policy.expr is not None
        try:
            known = answers.get(policy.expr) if answers is not None else None
            samples = known if known is not None else self._ask(policy.expr, now)
            if answers is not None:
                answers[policy.expr] = samples
            clear = None
            inputs = [policy.expr]
            if policy.clear_expr is not None and clear_query is not None:
                clear = self._clear(clear_query, now)
                inputs.append(policy.clear_expr)
            stale = self._stale(inputs, now, self._freshness(policy).max_sample_age_s)
        except QueryError as exc:
            self._metrics.query_failures.labels(policy.name).inc()
            return QueryResult(error=str(exc))
        return QueryResult(samples, clear, stale=stale)

    def _clear(self, query: str, now: float) -> Sequence[Sample]:
        """``query`` at ``now``, asked once per query and evaluation time."""
        with self._lock:
            known = self._clears.get(now, {}).get(query)
        if known is not None:
            return known
        found = self._ask(query, now)
        with self._lock:
            _remember(self._clears, now, {}, CLEARS_KEPT)[query] = found
        return found

    def _ask(self, expr: str, now: float) -> Sequence[Sample]:
        """``expr`` at ``now``, as columns (``PrometheusClient.query_vector``: the evaluation's
        steady path builds nothing per series) unless the client answers ``query`` its own way
        (the what-if's lockstep cache, a test's fake), which is then asked."""
        if type(self._prometheus).query is PrometheusClient.query:
            return self._prometheus.query_vector(expr, at=now)
        return self._prometheus.query(expr, at=now)

    def _stale(self, exprs: Sequence[str], now: float, bound_s: float) -> tuple[StaleInput, ...]:
        """The input series of ``exprs`` at ``now`` whose newest sample is older than
        ``bound_s``, from those already asked at ``now`` (``prefetch_ages``) and one query for
        the rest."""
        inputs = list(dict.fromkeys(s for e in exprs for s in input_selectors(e)))
        with self._lock:
            known = dict(self._ages.get(now, {}))
        missing = [s for s in inputs if (s, bound_s) not in known]
        if missing:
            known.update(self._ask_stale(missing, now, bound_s))
        stale = [(s, found) for s in inputs if (found := known[s, bound_s])]
        if not stale:
            return ()
        on, ignoring = join_labels(tuple(exprs))
        return tuple(StaleInput(s, found, on, ignoring) for s, found in stale)

    def _ask_stale(self, inputs: Sequence[str], now: float, bound_s: float) -> _Ages:
        """The stale series of ``inputs`` at ``now`` in one query, remembered for ``now``."""
        found = self._prometheus.stale_series(inputs, bound_s, at=now)
        got = {(s, bound_s): found.get(s, ()) for s in inputs}
        with self._lock:
            _remember(self._ages, now, {}).update(got)
        return got

    def prefetch_ages(self, policies: Sequence[Policy], now: float) -> None:
        """The stale series of every input of ``policies`` at ``now`` in one query (they
        share it: one probe per group run instead of one per policy). The probe is the same
        for every run of the group (``age_selectors``, all of them when any is not known yet
        at ``now``, with the group's freshness bound), so the what-if can ask it beforehand
        (``gpuops.sim.whatif``). A failure is left to each policy's own ask (``_stale``),
        which then skips its evaluation."""
        if not policies:
            return
        selectors = age_selectors(policies)
        bound_s = self._freshness(policies[0]).max_sample_age_s
        with self._lock:
            known = self._ages.get(now, {})
            if all((s, bound_s) in known for s in selectors):
                return
        try:
            self._ask_stale(selectors, now, bound_s)
        except QueryError as exc:
            log.debug("stale input series at %s not known yet: %s", now, exc)

    def population(
        self,
        policy: Policy,
        now: float,
        decisions: Iterable[Decision] = (),
        reuse: bool = True,
    ) -> int | None:
        """How many targets ``max_fraction`` of ``policy`` divides by at ``now`` (None: the
        query failed, which holds what needs it). ``reuse``: a count already made for this
        very evaluation time (by another policy or group evaluated at it) is taken again; the
        gate's recheck at execution passes False and always asks Prometheus, so that a fleet
        that shrank since (a dead rack's series drop out of results at once: staleness
        markers) or a Prometheus that went away is seen then."""
        expr = population_expr(policy, {n for d in decisions for n in d.target.labels})
        if expr is None:
            # max_fraction of targets without labels (`sum(x) > 10`): there is only one
            return 1 if policy.max_fraction is not None else None
        if reuse:
            with self._lock:
                known = self._populations.get(expr)
            if known is not None and known[0] == now:
                return known[1]
        try:
            if policy.population is None:  # ours: one number back, not every target's series
                counted = self._prometheus.query(f"count({expr})", at=now)
                found = int(counted[0].value) if counted else 0
            else:
                found = len(self._prometheus.query(expr, at=now))
        except QueryError as exc:
            log.warning("population of %s unknown: %s", policy.name, exc)
            return None
        if reuse:
            with self._lock:
                if len(self._populations) >= POPULATIONS_KEPT:
                    self._populations.clear()
                self._populations[expr] = (now, found)
        return found


def age_selectors(policies: Iterable[Policy]) -> tuple[str, ...]:
    """The inputs of ``policies``' expressions and clear expressions, each once, in order: a
    group run asks their stale series first, in one query (``Queries.prefetch_ages``:
    ``gpuops.sources.promql.stale_expr`` of them), which the what-if prefetches."""
    exprs = (e for p in policies for e in (p.expr, p.clear_expr) if e is not None)
    return tuple(dict.fromkeys(s for e in exprs for s in input_selectors(e)))


def _remember(cache: dict[float, _V], at: float, empty: _V, kept: int = TIMES_KEPT) -> _V:
    """The entry of evaluation time ``at`` in ``cache`` (made from ``empty`` when new; the
    oldest times are forgotten past ``kept``)."""
    entry = cache.get(at)
    if entry is None:
        while len(cache) >= kept:
            del cache[min(cache)]
        entry = cache[at] = empty
    return entry
