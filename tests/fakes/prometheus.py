"""A Prometheus query client for engine tests that need no real Prometheus: answers each expr
from ``results`` (a list of label sets, each a sample of value 0.1 at the query time; an
Exception value is raised as a ``QueryError``; ``count(EXPR)`` of a registered EXPR is its
number of series, as in PromQL). Sample ages are tested against a real
Prometheus (tests/integration/test_freshness_prometheus.py), so ``sample_age`` says "unknown"."""

from __future__ import annotations

from typing import Any

from engine.decisions import Sample, freeze
from engine.prometheus import QueryError


class FakePrometheus:
    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.queries: list[str] = []  # every expr asked, in order

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        self.queries.append(expr)
        inner = expr[len("count(") : -1] if expr.startswith("count(") else None
        if expr not in self.results and inner is not None and inner in self.results:
            series = self.results[inner]  # PromQL's count() of a registered result
            if isinstance(series, Exception):
                raise QueryError(str(series))
            return (Sample(freeze({}), float(len(series)), at or 0),) if series else ()
        value = self.results.get(expr, ())
        if isinstance(value, Exception):
            raise QueryError(str(value))
        return tuple(Sample(freeze(labels), 0.1, at or 0) for labels in value)

    def sample_age(self, exprs: Any, at: float | None = None) -> float | None:
        return None

    def sample_ages(self, selectors: Any, at: float | None = None) -> dict[str, float]:
        return {}
