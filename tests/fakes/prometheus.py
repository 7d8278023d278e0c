"""Prometheus query clients for engine tests that need no real Prometheus: each answers an
expr from ``results`` (a list of label sets, each a sample of value 0.1 at the query time; an
Exception value is raised as a ``QueryError``; ``count(EXPR)`` of a registered EXPR is its
number of series, as in PromQL). Sample ages are tested against a real
Prometheus (tests/integration/test_freshness_prometheus.py), so ``stale_series`` finds none.

``FakePrometheus`` answers ``query`` with tuples of ``Sample`` (as the what-if's lockstep
client and other clients that answer ``query`` their own way do: the cycle then asks
``query``). ``FakePrometheusClient`` is a ``PrometheusClient`` that answers only
``query_vector``, through the real decoder (``PrometheusClient._decode``: ``Answers``,
``decode_vector``) of the JSON an instant query returns: the cycle takes the path it takes
against a real Prometheus (columns, the evaluation's steady path, answers shared by policies
with the same expr)."""

from __future__ import annotations

from typing import Any

import orjson

from gpuops.model.decisions import Sample, Vector, freeze
from gpuops.sources.prometheus import Answers, PrometheusClient, QueryError


class _Script:
    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.queries: list[str] = []  # every expr asked, in order

    def _answer(self, expr: str, at: float | None) -> list[dict[str, Any]]:
        """``expr``'s answer as Prometheus writes ``data.result`` (JSON-decoded)."""
        self.queries.append(expr)
        ts = float(at or 0)
        inner = expr[len("count(") : -1] if expr.startswith("count(") else None
        if expr not in self.results and inner is not None and inner in self.results:
            series = self.results[inner]  # PromQL's count() of a registered result
            if isinstance(series, Exception):
                raise QueryError(str(series))
            return [{"metric": {}, "value": [ts, str(len(series))]}] if series else []
        value = self.results.get(expr, ())
        if isinstance(value, Exception):
            raise QueryError(str(value))
        # a copy per answer, as a decoder makes: the test may change its label sets later
        return [{"metric": dict(labels), "value": [ts, "0.1"]} for labels in value]

    def stale_series(
        self, inputs: Any, bound_s: float, at: float | None = None
    ) -> dict[str, tuple[Sample, ...]]:
        return {}


class FakePrometheus(_Script):
    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        return tuple(
            Sample(freeze(item["metric"]), float(item["value"][1]), item["value"][0])
            for item in self._answer(expr, at)
        )


class FakePrometheusClient(_Script, PrometheusClient):
    """A ``PrometheusClient`` without a server: ``query`` is the client's own (it asks
    ``query_vector``), so ``type(client).query is PrometheusClient.query``."""

    def __init__(self) -> None:  # no session: nothing is sent anywhere
        _Script.__init__(self)
        self._last_answers = Answers()

    def query_vector(self, expr: str, at: float | None = None) -> Vector:
        """The answer as the client decodes the bytes Prometheus sends (compact JSON, as
        Prometheus writes it, so that ``Answers`` recognises an answer's series again)."""
        data = {"resultType": "vector", "result": self._answer(expr, at)}
        with self._errors(expr):
            return self._decode(expr, orjson.dumps({"status": "success", "data": data}))
