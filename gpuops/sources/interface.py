"""``MetricsSource``: what the engine needs from a Prometheus.

The seam between the engine and where its metrics come from. Annotated by
``gpuops.runtime`` (the cycle asks instant queries, as columns, and the stale-series probe),
``gpuops.offline.backtest`` (range queries) and ``gpuops.sim`` (the what-if hands the engine
a client that answers a repeated instant query from memory); satisfied by
``gpuops.sources.prometheus.PrometheusClient`` (any server speaking the Prometheus HTTP API)
and by the test fakes of ``tests/fakes/prometheus.py``. Every method raises
``gpuops.sources.errors.QueryError`` when its answer cannot be used: nothing may be concluded
from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from gpuops.model.decisions import Sample, Vector


class MetricsSource(Protocol):
    """A Prometheus to ask: instant and range PromQL queries, and the stale-series probe."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        """The samples of ``expr`` evaluated at ``at`` (unix seconds; None: the server's
        now); a scalar is one sample without labels, ``NaN`` samples are left out."""
        ...

    def query_vector(self, expr: str, at: float | None = None) -> Vector:
        """``query`` as columns (``Vector``: no object per series until one is read)."""
        ...

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> Mapping[float, tuple[Sample, ...]]:
        """``expr`` evaluated at every ``step_s`` from ``start`` to ``end`` (unix seconds):
        the samples of each step by its timestamp (steps without any sample are absent)."""
        ...

    def stale_series(
        self, inputs: Iterable[str], bound_s: float, at: float | None = None
    ) -> Mapping[str, tuple[Sample, ...]]:
        """The series each of ``inputs`` (PromQL input selectors, as
        ``gpuops.sources.promql.input_selectors`` writes them) reads whose newest sample is
        older than ``bound_s`` seconds at ``at``; an input with no such series is absent."""
        ...
