"""The engine's Prometheus client in the policies-on run: answers kept per evaluation instant,
and a group's queries asked before its cycle runs, side by side.

Built by ``gpuops.sim.whatif.runs`` (``run_on``) for the engine; ``gpuops.sim.whatif.loop``
prefetches through it and forgets its answers at every step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import requests

from gpuops.model.decisions import Sample, freeze
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promql import AGE_LABEL, stale_expr


class LockstepPrometheus(PrometheusClient):
    """The engine's Prometheus client in the "on" run: an instant query asked again at the
    same evaluation time answers what it answered (the policies of one group, and the
    groups of one instant, share selectors and stale-series probes), and ``prefetch`` asks
    the queries a group's cycle will ask before it runs, side by side. That is exact here,
    not an approximation: in lockstep nothing is written while the engine evaluates instant
    ``t``, so a query at ``t`` cannot change its answer (a live engine may not do this:
    samples arrive meanwhile). Answers are kept by instant and query, so the interval groups
    (at ``now``) and the cron groups (at ``cron_time(now)``) of a step off the whole minute
    keep each other's, until ``forget`` at the start of the next step. A query in flight is
    waited for, not asked twice; errors are not kept (the next ask asks again)."""

    def __init__(self, url: str, session: requests.Session, workers: int = 4) -> None:
        super().__init__(url, session=session)
        self._answers: dict[tuple[float, str], Future[tuple[Sample, ...]]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpuops-whatif-prefetch")
        self.asked = 0
        self.answered = 0
        """Queries asked, and those answered from an earlier (or prefetched) answer."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        if at is None:
            return super().query(expr)
        answer, mine = self._claim(expr, at, asked=True)
        if mine:
            self._fetch(expr, at, answer)
        return answer.result()

    def prefetch(self, exprs: Iterable[str], at: float) -> None:
        """Start asking ``exprs`` at ``at`` in the background (each once)."""
        for expr in exprs:
            answer, mine = self._claim(expr, at, asked=False)
            if mine:
                self._pool.submit(self._fetch, expr, at, answer)

    def prefetch_ages(self, probes: Iterable[tuple[tuple[str, ...], float]], at: float) -> None:
        """Start asking the stale-series probes of ``probes`` (each the inputs of one group's
        ``gpuops.sources.prometheus.stale_expr`` and its freshness bound) at ``at``, as one probe of
        all their inputs per bound: each group's probe is then answered from it (the same
        series, numbered as that probe numbers its inputs), not asked. Exact: each input's
        part of a probe does not depend on the other parts. The groups of a step share
        inputs (the GPUs' utilization and allocation): each was read once per group before."""
        by_bound: dict[float, list[tuple[str, ...]]] = {}
        for selectors, bound_s in dict.fromkeys(probes):
            if selectors:
                by_bound.setdefault(bound_s, []).append(selectors)
        for bound_s, wanted in by_bound.items():
            self._prefetch_stale(wanted, bound_s, at)

    def _prefetch_stale(self, wanted: list[tuple[str, ...]], bound_s: float, at: float) -> None:
        union = tuple(dict.fromkeys(s for p in wanted for s in p))
        whole = stale_expr(union, bound_s)
        if whole is None:
            return
        answer, mine = self._claim(whole, at, asked=False)
        if mine:
            self._pool.submit(self._fetch, whole, at, answer)
        for selectors in wanted:
            expr = stale_expr(selectors, bound_s)
            if expr is None:
                continue
            part, todo = self._claim(expr, at, asked=False)
            if todo:
                numbers = {str(union.index(s)): str(i) for i, s in enumerate(selectors)}
                answer.add_done_callback(partial(self._renumber, expr, at, numbers, part))

    def _renumber(
        self,
        expr: str,
        at: float,
        numbers: dict[str, str],
        part: Future[tuple[Sample, ...]],
        whole: Future[tuple[Sample, ...]],
    ) -> None:
        """``part`` (the probe ``expr``) from the answer of the probe of all selectors:
        the samples of its selectors, numbered ``numbers`` (union index -> its index)."""
        error = whole.exception()
        if error is None:
            found = tuple(
                Sample(freeze({**s.labels, AGE_LABEL: numbers[i]}), s.value, s.timestamp)
                for s in whole.result()
                if (i := s.labels.get(AGE_LABEL)) in numbers
            )
            part.set_result(found)
            return
        with self._lock:  # asked again by whoever asks it (the cycle, on its own)
            if self._answers.get((at, expr)) is part:
                del self._answers[at, expr]
        part.set_exception(error)

    def _claim(self, expr: str, at: float, asked: bool) -> tuple[Future[tuple[Sample, ...]], bool]:
        """The answer to ``expr`` at ``at``, and whether the caller is to fetch it."""
        with self._lock:
            self.asked += asked
            known = self._answers.get((at, expr))
            if known is not None:
                self.answered += asked
                return known, False
            answer: Future[tuple[Sample, ...]] = Future()
            self._answers[at, expr] = answer
            return answer, True

    def forget(self) -> None:
        """Forget every answer (``PolicyLoop.evaluate``: once per step, before it prefetches;
        the step before has finished its actions, so nothing asks those instants again)."""
        with self._lock:
            self._answers = {}

    def _fetch(self, expr: str, at: float, answer: Future[tuple[Sample, ...]]) -> None:
        try:
            answer.set_result(super().query(expr, at=at))
        except Exception as exc:  # for every waiter; forgotten, so the next ask asks again
            with self._lock:
                if self._answers.get((at, expr)) is answer:
                    del self._answers[at, expr]
            answer.set_exception(exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
