"""A Prometheus query client for engine tests that need no real Prometheus: answers each expr
from ``results`` (a list of label sets, each a sample of value 0.1 at the query time; an
Exception value is raised as a ``QueryError``). Sample ages are tested against a real
Prometheus (tests/integration/test_freshness_prometheus.py), so ``sample_age`` says "unknown"."""

from __future__ import annotations

from typing import Any

from engine.decisions import Sample, freeze
from engine.prometheus import QueryError


class FakePrometheus:
    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        value = self.results.get(expr, ())
        if isinstance(value, Exception):
            raise QueryError(str(value))
        return tuple(Sample(freeze(labels), 0.1, at or 0) for labels in value)

    def sample_age(self, exprs: Any, at: float | None = None) -> float | None:
        return None
