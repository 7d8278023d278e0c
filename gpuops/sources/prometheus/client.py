"""The engine's window on Prometheus: the HTTP client of its query API, and its errors.

Called by ``gpuops.runtime`` (instant queries, as columns, and the stale-series probe),
``gpuops.offline.backtest`` (range queries) and ``gpuops.sim`` (the what-if); it satisfies
``gpuops.sources.interface.MetricsSource``. Every failure (connection refused, timeout, HTTP
error, bad PromQL, a result that is not a vector) becomes a ``QueryError`` with the original
chained (``PrometheusClient._errors``), so the runtime can turn it into a skipped evaluation.
Any server speaking the Prometheus HTTP API works (Thanos, Mimir, VictoriaMetrics).

Instant queries are sent by ``requests`` and their answers read by ``Answers`` (only the
values of an answer whose series are the last one's) or decoded in full
(``gpuops.sources.prometheus.vectors``); range queries go through prometheus-api-client.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from urllib.parse import urlencode

import orjson
import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpuops.model.decisions import Sample, Vector, freeze
from gpuops.sources.errors import MAX_ERROR_CHARS, QueryError, capped
from gpuops.sources.prometheus.answers import Answers
from gpuops.sources.prometheus.vectors import decode_answer, sample_time, sample_value
from gpuops.sources.promql.probe import AGE_LABEL, stale_expr

MAX_GET_QUERY_CHARS = 4096
"""A query whose encoded parameters are longer is sent as a POST form (``/api/v1/query``
takes both): a narrowed ``clear_expr`` for 1,000 targets is ~40 kB, and proxies refuse request
lines past ~8 kB (nginx's default buffers, Apache's ``LimitRequestLine``) with 414. Shorter
ones stay GETs, which read-only proxies and caches in front of Prometheus expect."""

FORM = "application/x-www-form-urlencoded"


def _read_environment_once(session: requests.Session, url: str) -> None:
    """Take what ``requests`` would read from the environment for ``url`` (the proxy from
    ``HTTP(S)_PROXY``/``ALL_PROXY`` unless ``NO_PROXY`` excludes it, credentials from
    ``~/.netrc`` or ``$NETRC``, a CA bundle from ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``)
    into ``session`` now, and stop it reading them again: with ``trust_env`` it does so on
    every request, opening and parsing the netrc file and the proxy variables for each of a
    cycle's queries (~20 % of a request's client CPU). The same settings apply, read once
    when the client is made (at engine start), as for any daemon's environment. Every
    request of this client goes to ``url``'s host."""
    proxies = requests.utils.get_environ_proxies(url)
    auth = requests.utils.get_netrc_auth(url)
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    session.trust_env = False
    session.proxies.update(proxies)
    if auth and session.auth is None:
        session.auth = auth
    if bundle and session.verify is True:
        session.verify = bundle


class PrometheusClient:
    """A ``MetricsSource`` over the Prometheus HTTP API at ``url``."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})
        if session is None:
            session = requests.Session()
            _read_environment_once(session, self.url)
        self._session = session
        self._last_answers = Answers()
        # No retries inside a query: a failed query is a skipped evaluation and the next cycle
        # asks again, so an outage costs one refused connection per query, not seconds.
        self._conn = PrometheusConnect(
            url=self.url,
            headers=self._headers,
            disable_ssl=False,
            session=self._session,
            retry=Retry(total=0, raise_on_status=False),
        )

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        """Evaluate ``expr`` at ``at`` (unix seconds; None: the server's now)."""
        return tuple(self.query_vector(expr, at))

    def query_vector(self, expr: str, at: float | None = None) -> Vector:
        """``query`` as columns (``decode_vector``: no object per series until one is read).
        The answer is decoded with orjson (requests' ``json`` would be most of a steady
        evaluation's CPU after the socket reads)."""
        form = _encoded(expr)
        if at is not None:
            form += f"&time={at:.3f}"
        with self._errors(expr):
            if len(form) <= MAX_GET_QUERY_CHARS:
                response = self._session.get(
                    f"{self.url}/api/v1/query?{form}",
                    headers=self._headers,
                    timeout=self.timeout_s,
                    stream=True,
                )
            else:  # the same parameters as a form, which the HTTP API takes as well
                response = self._session.post(
                    f"{self.url}/api/v1/query",
                    data=form,
                    headers={**self._headers, "Content-Type": FORM},
                    timeout=self.timeout_s,
                    stream=True,
                )
            with response:  # the connection back to the pool once read, closed on an error
                if response.status_code != 200:
                    reason = _http_error(response.status_code, response.content)
                    raise QueryError(f"Prometheus rejected {expr!r}: {reason}")
                # read in one call (requests' ``content`` reads 10 kB at a time through
                # urllib3: ~1.4 ms of CPU per MB of answer)
                body = response.raw.read(decode_content=True)
            return self._decode(expr, body)

    def _decode(self, expr: str, body: bytes) -> Vector:
        """The answer ``body`` to ``expr`` (``Answers``: only its values read when its series
        are those of the last answer); ``ValueError`` when it is not JSON or not an answer."""
        return self._last_answers.read(expr, body, decode_answer)

    def stale_series(
        self, inputs: Iterable[str], bound_s: float, at: float | None = None
    ) -> dict[str, tuple[Sample, ...]]:
        """The series each of ``inputs`` (as ``input_selectors`` names them) reads whose newest
        sample is older than ``bound_s`` at ``at``, in one query (``stale_expr``); an input with
        no such series is absent."""
        wanted = tuple(dict.fromkeys(inputs))
        probe = stale_expr(wanted, bound_s)
        if probe is None:
            return {}
        found: dict[str, list[Sample]] = {}
        for sample in self.query(probe, at=at):
            index = sample.labels.get(AGE_LABEL, "")
            if not index.isdigit() or int(index) >= len(wanted):
                raise QueryError(f"{probe!r} returned a series it did not ask for")
            found.setdefault(wanted[int(index)], []).append(sample)
        return {name: tuple(series) for name, series in found.items()}

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
                    v, t = sample_value(value), sample_time(ts)
                    if not math.isnan(v):
                        by_step.setdefault(t, []).append(Sample(labels, v, t))
            at = stop + step_s
        return {ts: tuple(samples) for ts, samples in by_step.items()}

    def _range_chunk(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[Mapping[str, str], list[Any]]]:
        """One range request: each series' labels and its ``values`` as the JSON has them."""
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
            why = "connection refused" if "refused" in str(exc) else capped(exc)
            raise QueryError(f"Prometheus at {self.url} unreachable: {why}") from exc
        except ValueError as exc:  # a body that is not JSON (requests' error is one too)
            raise QueryError(f"Prometheus at {self.url} sent an unreadable answer") from exc
        except requests.RequestException as exc:
            raise QueryError(f"Prometheus at {self.url} unreachable: {capped(exc)}") from exc
        except urllib3.exceptions.ReadTimeoutError as exc:  # the body read raw (query_vector)
            raise QueryError(
                f"Prometheus at {self.url} timed out after {self.timeout_s:g}s"
            ) from exc
        except urllib3.exceptions.DecodeError as exc:
            raise QueryError(f"Prometheus at {self.url} sent an unreadable answer") from exc
        except urllib3.exceptions.ProtocolError as exc:  # cut mid-answer, reset, ...
            why = exc.args[0] if exc.args and isinstance(exc.args[0], str) else capped(exc)
            raise QueryError(f"Prometheus at {self.url} unreachable: {why}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise QueryError(f"Prometheus at {self.url} unreachable: {capped(exc)}") from exc


@lru_cache(maxsize=256)
def _encoded(expr: str) -> str:
    """``query=expr`` form-encoded (``urlencode``), once per query text: a narrowed
    ``clear_expr`` of 40 kB is the same every evaluation while its targets fire, and quoting
    it runs Python code per character."""
    return urlencode({"query": expr})


def _http_error(status: int, body: bytes) -> str:
    """``HTTP 400: invalid parameter "query": ...`` from an answer that is not a 200: its
    ``error``, decoded (read out of the body's repr, a Prometheus parse error would be cut at
    its first escaped quote); the body itself, capped, when it holds none (a proxy's HTML
    page)."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, str):
        return f"HTTP {status}: {error}"[:MAX_ERROR_CHARS]
    return capped(f"HTTP Status Code {status} ({body!r})")


def _api_error(exc: BaseException) -> str:
    """``HTTP 400: parse error: ...`` out of the client's ``HTTP Status Code 400 (b'{json}')``."""
    text = str(exc)
    status = re.search(r"Status Code (\d+)", text)
    error = re.search(r'"error":\s*"((?:[^"\\]|\\.)*)"', text)
    if status and error:
        return f"HTTP {status.group(1)}: {error.group(1)}"[:MAX_ERROR_CHARS]
    return capped(exc)
