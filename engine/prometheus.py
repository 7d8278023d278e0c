"""The engine's window on Prometheus: instant queries through prometheus-api-client.

Called by ``engine.runtime``; returns ``Sample`` values. Every failure (connection refused,
timeout, HTTP error, bad PromQL, a result that is not a vector) becomes a ``QueryError`` with the
original chained, so the runtime can turn it into a skipped evaluation. Any server speaking the
Prometheus HTTP API works (Thanos, Mimir, VictoriaMetrics).

``sample_age`` says how old the newest data of a query's inputs is: the instant result of a
query carries the evaluation time, not its samples' times, so the series each vector selector
reads (parsed with ``promql-parser``, never by hand) are asked for ``timestamp()``. After a
SIGKILLed Prometheus restarts it serves its old samples until it scrapes again (no staleness
markers were written): their age is what tells them apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import promql_parser
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from engine.decisions import Sample, freeze

MAX_ERROR_CHARS = 256


class PrometheusError(Exception):
    """Base of what this module raises."""


class QueryError(PrometheusError):
    """A query did not produce a usable result; nothing may be concluded from it."""


class PrometheusClient:
    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # No retries inside a query: a failed query is a skipped evaluation and the next cycle
        # asks again, so an outage costs one refused connection per query, not seconds.
        self._conn = PrometheusConnect(
            url=self.url,
            headers=dict(headers or {}),
            disable_ssl=False,
            session=session,
            retry=Retry(total=0, raise_on_status=False),
        )

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        """Evaluate ``expr`` at ``at`` (unix seconds; None: the server's now)."""
        params: dict[str, Any] = {} if at is None else {"time": f"{at:.3f}"}
        with self._errors(expr):
            raw = self._conn.custom_query(expr, params=params, timeout=self.timeout_s)
        return parse_vector(raw, expr)

    def sample_age(self, exprs: Iterable[str], at: float | None = None) -> float | None:
        """How old (seconds, at ``at``) the oldest sample is that the vector selectors of
        ``exprs`` read; None when they read no series (or no selector reads the present)."""
        probe = age_expr(tuple(exprs))
        if probe is None:
            return None
        samples = self.query(probe, at=at)
        return max((s.value for s in samples), default=None)

    @contextmanager
    def _errors(self, expr: str) -> Iterator[None]:
        """Turn whatever the client raises into a ``QueryError`` (original chained)."""
        try:
            yield
        except PrometheusApiClientException as exc:
            raise QueryError(f"Prometheus rejected {expr!r}: {_api_error(exc)}") from exc
        except requests.Timeout as exc:
            raise QueryError(
                f"Prometheus at {self.url} timed out after {self.timeout_s:g}s"
            ) from exc
        except requests.ConnectionError as exc:
            why = "connection refused" if "refused" in str(exc) else _cap(exc)
            raise QueryError(f"Prometheus at {self.url} unreachable: {why}") from exc
        except ValueError as exc:  # a body that is not JSON (requests' error is one too)
            raise QueryError(f"Prometheus at {self.url} sent an unreadable answer") from exc
        except requests.RequestException as exc:
            raise QueryError(f"Prometheus at {self.url} unreachable: {_cap(exc)}") from exc

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> dict[float, tuple[Sample, ...]]:
        """Evaluate ``expr`` at every ``step_s`` from ``start`` to ``end`` (unix seconds):
        the samples of each step by its timestamp (steps without any sample are absent).
        Long ranges are split so that no request asks for more than 10,000 points."""
        by_step: dict[float, list[Sample]] = {}
        chunk = step_s * 10_000
        at = start
        while at <= end:
            stop = min(end, at + chunk - step_s)
            for labels, values in self._range_chunk(expr, at, stop, step_s):
                for ts, value in values:
                    v = _float(value)
                    if not math.isnan(v):
                        by_step.setdefault(float(ts), []).append(Sample(labels, v, float(ts)))
            at = stop + step_s
        return {ts: tuple(samples) for ts, samples in by_step.items()}

    def _range_chunk(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[Mapping[str, str], list[Any]]]:
        with self._errors(expr):
            raw = self._conn.custom_query_range(
                expr,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{step_s:g}",
                timeout=self.timeout_s,
            )
        if not isinstance(raw, list):
            raise QueryError(f"{expr!r} did not return a matrix")
        out = []
        for item in raw:
            try:
                labels = freeze({str(k): str(v) for k, v in item.get("metric", {}).items()})
                out.append((labels, list(item["values"])))
            except (KeyError, TypeError, AttributeError) as exc:
                raise QueryError(f"{expr!r} returned a malformed series: {item!r:.200}") from exc
        return out


@lru_cache(maxsize=1024)
def age_expr(exprs: tuple[str, ...]) -> str | None:
    """One query for the age of the oldest input series of ``exprs``: per distinct vector
    selector ``max(time() - timestamp(selector))``, the maximum over all. Selectors with
    ``offset`` or ``@`` read the past on purpose and are left out. None: no selector."""
    selectors: dict[str, None] = {}
    for expr in exprs:
        try:
            tree = promql_parser.parse(expr)
        except ValueError as exc:
            raise QueryError(f"cannot tell how old the data of {expr!r} is: {_cap(exc)}") from exc

        def visit(node: promql_parser.Expr) -> bool:
            if isinstance(node, promql_parser.VectorSelector):
                if node.offset is None and node.at is None:
                    selectors[str(node)] = None
            return True

        promql_parser.walk(tree, visit)
    if not selectors:
        return None
    parts = [
        f'label_replace(max(time() - timestamp({s})), "gpuops_input", "{i}", "", "")'
        for i, s in enumerate(selectors)
    ]
    return f"max({' or '.join(parts)})"


def parse_vector(raw: Any, expr: str) -> tuple[Sample, ...]:
    """Turn the ``data.result`` of an instant query into samples (a scalar gives one sample)."""
    if isinstance(raw, list) and len(raw) == 2 and not isinstance(raw[0], dict):
        return (Sample(freeze({}), _float(raw[1]), float(raw[0])),)
    if not isinstance(raw, list):
        raise QueryError(f"{expr!r} did not return a vector")
    samples = []
    for item in raw:
        try:
            ts, value = item["value"]
            labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise QueryError(f"{expr!r} returned a malformed series: {item!r:.200}") from exc
        v = _float(value)
        if math.isnan(v):
            continue
        samples.append(Sample(freeze(labels), v, float(ts)))
    return tuple(samples)


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise QueryError(f"not a number: {value!r:.50}") from exc


def _api_error(exc: BaseException) -> str:
    """``HTTP 400: parse error: ...`` out of the client's ``HTTP Status Code 400 (b'{json}')``."""
    text = str(exc)
    status = re.search(r"Status Code (\d+)", text)
    error = re.search(r'"error":\s*"((?:[^"\\]|\\.)*)"', text)
    if status and error:
        return f"HTTP {status.group(1)}: {error.group(1)}"[:MAX_ERROR_CHARS]
    return _cap(exc)


def _cap(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"
