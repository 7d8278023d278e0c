"""Prometheus query clients for engine tests that need no real Prometheus; each is a
``gpuops.sources.MetricsSource``, so it is handed to the engine, the cycle or the backtest as
the real client is.

``FakeSource`` is the base of the small fakes of the tests: a subclass answers ``query`` (or
``query_range``) its own way and the rest of the Protocol follows (``query_vector``: its
samples as columns; ``query_range``: ``query`` asked at each step); no series is stale
(sample ages are tested against a real Prometheus: tests/integration/
test_freshness_prometheus.py).

``FakePrometheus`` and ``FakePrometheusClient`` answer an expr from ``results`` (a list of
label sets, each a sample of value 0.1 at the query time; an Exception value is raised as a
``QueryError``; ``count(EXPR)`` of a registered EXPR is its number of series, as in PromQL).
``FakePrometheus`` answers ``query`` with tuples of ``Sample`` (as the what-if's lockstep
client and other clients that answer ``query`` their own way do: the cycle then asks
``query``). ``FakePrometheusClient`` is a ``PrometheusClient`` that answers only
``query_vector``, through the real decoder (``PrometheusClient._decode``: ``Answers``,
``decode_vector``) of the JSON an instant query returns: the cycle takes the path it takes
against a real Prometheus (columns, the evaluation's steady path, answers shared by policies
with the same expr)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from gpuops.model.decisions import Sample, Vector, freeze
from gpuops.sources import QueryError
from gpuops.sources.prometheus import Answers, PrometheusClient


def columns(samples: Sequence[Sample]) -> Vector:
    """``samples`` as the columns ``query_vector`` answers."""
    return Vector(
        [s.labels for s in samples], [s.value for s in samples], [s.timestamp for s in samples]
    )


def stepped(
    ask: Callable[[str, float], tuple[Sample, ...]],
    expr: str,
    start: float,
    end: float,
    step_s: float,
) -> dict[float, tuple[Sample, ...]]:
    """A range query made of instant ones: ``ask(expr, at)`` at every step from ``start`` to
    ``end``, by step; steps without any sample are absent, as in Prometheus' answer."""
    found = {}
    for i in range(int((end - start) // step_s) + 1):
        at = start + i * step_s
        samples = ask(expr, at)
        if samples:
            found[at] = samples
    return found


class FakeSource:
    """A ``MetricsSource`` whose answers come from its ``query``, which a subclass gives
    (this one's is a tripwire); no series is ever stale."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        raise AssertionError(f"{type(self).__name__} is not asked instant queries ({expr!r})")

    def query_vector(self, expr: str, at: float | None = None) -> Vector:
        return columns(self.query(expr, at))

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> dict[float, tuple[Sample, ...]]:
        return stepped(self.query, expr, start, end, step_s)

    def stale_series(
        self, inputs: Iterable[str], bound_s: float, at: float | None = None
    ) -> dict[str, tuple[Sample, ...]]:
        return {}  # every sample fresh


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

    def _samples(self, expr: str, at: float | None) -> tuple[Sample, ...]:
        return tuple(
            Sample(freeze(item["metric"]), float(item["value"][1]), item["value"][0])
            for item in self._answer(expr, at)
        )

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> dict[float, tuple[Sample, ...]]:
        return stepped(self._samples, expr, start, end, step_s)

    def stale_series(
        self, inputs: Iterable[str], bound_s: float, at: float | None = None
    ) -> dict[str, tuple[Sample, ...]]:
        return {}


class FakePrometheus(_Script):
    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        return self._samples(expr, at)

    def query_vector(self, expr: str, at: float | None = None) -> Vector:
        return columns(self._samples(expr, at))


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
