"""The engine's window on Prometheus: instant queries through prometheus-api-client.

Called by ``gpuops.runtime``; returns ``Sample`` values. Every failure (connection refused,
timeout, HTTP error, bad PromQL, a result that is not a vector) becomes a ``QueryError`` with the
original chained, so the runtime can turn it into a skipped evaluation. Any server speaking the
Prometheus HTTP API works (Thanos, Mimir, VictoriaMetrics).

``stale_series`` says which input series of a policy's queries have no sample newer than the
freshness bound: the instant result of a query carries the evaluation time, not its samples'
times, so every series a selector reads (parsed with ``promql-parser``, never by hand) is asked
about (``input_selectors``, ``stale_expr``; docs/policies.md, "Fresh data"). A series read
through a range selector or a subquery keeps answering for the whole window after its exporter
died (Prometheus' staleness marker ends only what instant selectors read), and a SIGKILLed
Prometheus that restarts serves its old samples until it scrapes again (no staleness markers
were written): the age of their newest sample is what tells them apart.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any
from urllib.parse import urlencode

import orjson
import promql_parser
import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpuops.model.decisions import Sample, Vector, freeze

MAX_ERROR_CHARS = 256

MAX_GET_QUERY_CHARS = 4096
"""A query whose encoded parameters are longer is sent as a POST form (``/api/v1/query``
takes both): a narrowed ``clear_expr`` for 1,000 targets is ~40 kB, and proxies refuse request
lines past ~8 kB (nginx's default buffers, Apache's ``LimitRequestLine``) with 414. Shorter
ones stay GETs, which read-only proxies and caches in front of Prometheus expect."""

FORM = "application/x-www-form-urlencoded"


class PrometheusError(Exception):
    """Base of what this module raises."""


class QueryError(PrometheusError):
    """A query did not produce a usable result; nothing may be concluded from it."""


def _read_environment_once(session: requests.Session, url: str) -> None:
    """Take what ``requests`` would read from the environment for ``url`` (the proxy from
    ``HTTP(S)_PROXY``/``ALL_PROXY`` unless ``NO_PROXY`` excludes it, credentials from
    ``~/.netrc`` or ``$NETRC``, a CA bundle from ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``)
    into ``session`` now, and stop it reading them again: with ``trust_env`` it does so on
    every request, which opened and parsed the netrc file and the proxy variables for each
    of a cycle's queries (issue 15: ~20 % of a request's client CPU; ~5 % of a steady round).
    The same settings apply, read once when the client is made (at engine start), as for any
    daemon's environment. Every request of this client goes to ``url``'s host."""
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
        The answer is decoded with orjson (issue 15: requests' ``json`` was most of a steady
        round's CPU after the socket reads)."""
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
                # read in one call (issue 15: requests' ``content`` reads 10 kB at a time
                # through urllib3, ~1.4 ms of CPU per MB of answer, ~6 % of a steady round)
                body = response.raw.read(decode_content=True)
            return self._decode(expr, body)

    def _decode(self, expr: str, body: bytes) -> Vector:
        """The answer ``body`` to ``expr`` (``Answers``: only its values read when its series
        are those of the last answer); ``ValueError`` when it is not JSON or not an answer."""
        return self._last_answers.read(expr, body, _decode_answer)

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
        except urllib3.exceptions.ReadTimeoutError as exc:  # the body read raw (query_vector)
            raise QueryError(
                f"Prometheus at {self.url} timed out after {self.timeout_s:g}s"
            ) from exc
        except urllib3.exceptions.DecodeError as exc:
            raise QueryError(f"Prometheus at {self.url} sent an unreadable answer") from exc
        except urllib3.exceptions.ProtocolError as exc:  # cut mid-answer, reset, ...
            why = exc.args[0] if exc.args and isinstance(exc.args[0], str) else _cap(exc)
            raise QueryError(f"Prometheus at {self.url} unreachable: {why}") from exc
        except urllib3.exceptions.HTTPError as exc:
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
                    v, t = _float(value), _time(ts)
                    if not math.isnan(v):
                        by_step.setdefault(t, []).append(Sample(labels, v, t))
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


def _decode_answer(body: bytes, expr: str) -> Vector:
    """``body`` decoded in full (``decode_vector``); ``ValueError`` when it is not an answer."""
    try:
        raw = orjson.loads(body)["data"]["result"]
    except (KeyError, TypeError) as exc:
        raise ValueError("not a query answer") from exc
    return decode_vector(raw, expr)


class Answers:
    """The last answer to each query whose series can be recognised again (issue 15: JSON
    decoding was most of a steady round): an answer is split at its samples' values, in C
    (``_SAMPLE``: ``,"value":[time,"number"]}``); when what is left (every byte but the
    values) is the same as in the query's last answer, its series are the same, in the same
    order, and only the values are read: no ``metric`` object decoded, the target keys made
    once (``Vector.with_columns``). An answer is remembered only when the split is sound:
    it has exactly one ``"value"`` token per series (a quote inside a JSON string is
    escaped, so none hides in a label; a label valued ``value`` makes the answer not
    remembered), each sample's value and time are those the full decoding read, and no
    value is ``NaN`` (left out by ``decode_vector``). A value that is not a number as
    Prometheus writes it, or ``NaN``, is not split off (``_SAMPLE``): such an answer's
    skeleton is no remembered one's, and the full decoding names it.

    An answer whose series changed a little (a ``util < 0.2`` whose targets come and go: at
    most ``MEND_SHARE`` of its series, or ``MEND_MIN``, not in the last answer) is mended
    (``_mended``): each series' text (its ``{"metric":{...}`` between two samples) that is
    byte for byte one of the last answer's takes that series' labels, and only the others
    are decoded, one by one (issue 15: with 1 % of the GPUs changing state a round, the full
    decoding of the churning answers was a fifth of a 50k round). It is then what a full
    decoding gives: the text around the series is the last answer's, and each text between
    two samples is one of its series' or decodes, closed, to an object holding only
    ``metric``, an object (one series); anything else takes the full decoding.
    An answer whose series changed more costs one split and one full decoding (the split
    is reused to remember it). A query whose series changed so ``MISSES`` answers in a row
    is forgotten and its next ``PAUSE`` answers are decoded in full without splitting (as
    without this cache), then it is tried again: such a query costs what a full decoding
    does and keeps no memory."""

    KEPT = 64
    """Queries remembered (the least recently asked are forgotten first)."""

    MISSES = 2
    """Answers in a row with other series after which a query stops being split."""

    PAUSE = 16
    """Answers decoded in full, unsplit, before a churning query is tried again."""

    MEND_SHARE = 4
    """An answer is mended (``_mended``) when at most 1 in this many of its series are new."""

    MEND_MIN = 64
    """... or at most this many (a small answer whose few series all changed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: OrderedDict[str, _Known] = OrderedDict()
        self._misses: OrderedDict[str, list[int]] = OrderedDict()
        """Per query that had other series lately: [misses in a row, answers still unsplit]
        (at most ``KEPT`` queries)."""

    def read(self, expr: str, body: bytes, full: Callable[[bytes, str], Vector]) -> Vector:
        """The answer ``body`` to ``expr``: only its values read when its series are those
        of the last one, else ``full(body, expr)`` (and ``body`` remembered when sound)."""
        with self._lock:
            churn = self._misses.get(expr)
            if churn is not None and churn[1]:
                churn[1] -= 1
                paused, known = True, None
            else:
                paused = False
                known = self._last.get(expr)
                if known is not None:
                    self._last.move_to_end(expr)
        if paused:
            return full(body, expr)
        parts = _SAMPLE.split(body)
        if known is not None:
            vector = self._again(parts, known)
            if vector is None:
                mended = self._mended(parts, known)
                if mended is not None:
                    vector = mended.vector
                    with self._lock:
                        self._keep(expr, mended)
            if vector is not None:
                with self._lock:
                    self._misses.pop(expr, None)
                return vector
        vector = full(body, expr)
        if known is not None and self._missed(expr):
            return vector
        self._remember(expr, body, parts, vector)
        return vector

    def _missed(self, expr: str) -> bool:
        """Count an answer to ``expr`` whose series were not the last one's; True when the
        query is now paused (forgotten: its next ``PAUSE`` answers are not split). After a
        pause the count goes on, so one more miss pauses it again."""
        with self._lock:
            churn = self._misses.setdefault(expr, [0, 0])
            self._misses.move_to_end(expr)
            while len(self._misses) > self.KEPT:
                self._misses.popitem(last=False)
            churn[0] += 1
            if churn[0] < self.MISSES:
                return False
            churn[1] = self.PAUSE
            self._last.pop(expr, None)
            return True

    @staticmethod
    def _again(parts: list[bytes], known: _Known) -> Vector | None:
        """The answer split into ``parts`` when its series are those of ``known``."""
        skeleton, vector = known.skeleton, known.vector
        if parts[0::3] != skeleton:
            return None
        # every value a number (``_SAMPLE`` splits at no other): nothing more to check
        return vector.with_columns(list(map(float, parts[2::3])), list(map(float, parts[1::3])))

    def _remember(self, expr: str, body: bytes, parts: list[bytes], vector: Vector) -> None:
        """Keep ``body``'s split ``parts`` to recognise the next answer to ``expr`` (when
        sound)."""
        values = list(map(float, parts[2::3])) if len(parts) == 3 * len(vector) + 1 else None
        if (
            not vector
            or values is None
            or body.count(b'"value"') != len(vector)
            or values != vector.values  # NaN is never equal: not remembered
            or list(map(float, parts[1::3])) != vector.times
        ):
            with self._lock:
                self._last.pop(expr, None)
            return
        with self._lock:
            self._keep(expr, _Known(parts[0::3], vector))

    def _keep(self, expr: str, known: _Known) -> None:
        """Remember ``known`` as the last answer to ``expr`` (the lock held)."""
        self._last[expr] = known
        self._last.move_to_end(expr)
        while len(self._last) > self.KEPT:
            self._last.popitem(last=False)

    def _mended(self, parts: list[bytes], known: _Known) -> _Known | None:
        """The answer split into ``parts`` from the series of ``known`` and the few new ones
        decoded one by one, as the next one to remember, or None: not sound here (see the
        class), or too many new."""
        count = len(parts) // 3
        skeleton = parts[0::3]
        pieces = known.pieces()
        if pieces is None or len(parts) != 3 * count + 1 or count == 0:
            return None
        head, tail = known.head, known.skeleton[-1]
        first = skeleton[0]
        if skeleton[-1] != tail or not first.startswith(head):
            return None
        # Sound without counting "value" tokens (``_remember``): the text around the series
        # is that of an answer with one series per split, and each text between two splits
        # is a known series' or decodes to one (``_series_metric``), so this body is such
        # an answer too. A series not split off (NaN) leaves two series in one text, which
        # does not decode to one, or lands in the tail, which then differs.
        texts = skeleton[:-1]
        texts[0] = b"," + first[len(head) :]
        metrics: list[Any] = list(map(pieces.get, texts))
        new = metrics.count(None)
        if new > max(self.MEND_MIN, count // self.MEND_SHARE):
            return None
        at = -1
        for _ in range(new):
            at = metrics.index(None, at + 1)
            metric = _series_metric(texts[at])
            if metric is None:
                return None
            metrics[at] = metric
        vector = Vector(metrics, list(map(float, parts[2::3])), list(map(float, parts[1::3])))
        return _Known(skeleton, vector)


class _Known:
    """A remembered answer (``Answers``): its skeleton (every byte but the samples' times
    and values, cut at them) and its vector; for mending (``Answers._mended``), the text
    before its first series (``head``) and, made when first needed, each series' text
    (``,{"metric":{...}``) to its labels."""

    __slots__ = ("skeleton", "vector", "head", "_pieces")

    def __init__(self, skeleton: list[bytes], vector: Vector) -> None:
        self.skeleton, self.vector = skeleton, vector
        first = skeleton[0]
        start = first.find(_RESULT)
        # only where the answer has one (review 15e: of two, a duplicate key, orjson keeps the
        # last, and a head cut at the first would read another array's series)
        once = start >= 0 and first.count(_RESULT) == 1
        self.head = first[: start + len(_RESULT)] if once else b""
        self._pieces: dict[bytes, Any] | None = None

    def pieces(self) -> dict[bytes, Any] | None:
        """Each series' text to its labels (None: the answer's head not found)."""
        if not self.head:
            return None
        if self._pieces is None:
            texts = self.skeleton[:-1]
            texts[0] = b"," + texts[0][len(self.head) :]
            self._pieces = dict(zip(texts, self.vector.metrics, strict=True))
        return self._pieces


_RESULT = b'"result":['
"""Where an answer's series begin (``_Known``): a label's text cannot hold it (its quotes
would be escaped), and the top level before it is the answer's own (status, data...)."""


def _series_metric(text: bytes) -> dict[str, Any] | None:
    """The labels of a series whose text (``,{"metric":{...}``, up to its sample) is
    ``text``: None unless, closed, it is a JSON object holding only ``metric``, an
    object."""
    if text[:1] != b",":  # the comma between two series (review 15e: "}" or " " there is
        return None  # not JSON, which the full decoding refuses)
    try:
        series = orjson.loads(text[1:] + b"}")
    except orjson.JSONDecodeError:
        return None
    if type(series) is not dict or len(series) != 1:
        return None
    metric = series.get("metric")
    return metric if type(metric) is dict else None


@lru_cache(maxsize=256)
def _encoded(expr: str) -> str:
    """``query=expr`` form-encoded (``urlencode``), once per query text: a narrowed
    ``clear_expr`` of 40 kB is the same every round while its targets fire, and quoting it
    runs Python code per character."""
    return urlencode({"query": expr})


AGE_LABEL = "gpuops_input"
"""The label that tells the parts of a ``stale_expr`` answer apart (the input's index)."""

LOOKBACK_S = 300.0
"""Prometheus' default ``--query.lookback-delta``: how far back an instant selector inside a
subquery reads at each of the subquery's steps (``input_selectors``)."""


@lru_cache(maxsize=1024)
def input_selectors(expr: str) -> tuple[str, ...]:
    """The distinct inputs ``expr`` reads the present with (as PromQL text): an instant
    selector as itself; a selector read over a window (a range selector, or any selector
    inside a subquery) as ``selector[window]``, the window being how far back a sample it
    reads may lie: the range, plus every enclosing subquery's range, plus ``LOOKBACK_S`` for
    an instant selector inside a subquery. Selectors with ``offset`` or ``@`` (or inside a
    subquery that has one) read the past on purpose and are left out."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError as exc:
        raise QueryError(f"cannot tell how old the data of {expr!r} is: {_cap(exc)}") from exc
    inputs: dict[str, None] = {}
    _collect_inputs(tree, 0.0, inputs)
    return tuple(inputs)


def _collect_inputs(node: Any, reach: float, inputs: dict[str, None]) -> None:
    """Add the inputs of ``node`` to ``inputs``; ``reach``: the ranges of the subqueries
    around it (0: none)."""
    pp = promql_parser
    if isinstance(node, pp.VectorSelector):
        if node.offset is None and node.at is None:
            text = selector_text(node)
            inputs[text if not reach else _windowed(text, reach + LOOKBACK_S)] = None
    elif isinstance(node, pp.MatrixSelector):
        inner = node.vector_selector
        if inner.offset is None and inner.at is None:
            window = reach + node.range.total_seconds()
            inputs[_windowed(selector_text(inner), window)] = None
    elif isinstance(node, pp.SubqueryExpr):
        if node.range is None:  # promql-parser's type allows it; PromQL does not
            raise QueryError(f"a subquery without a range: {node}")
        if node.offset is None and node.at is None:
            _collect_inputs(node.expr, reach + node.range.total_seconds(), inputs)
    elif isinstance(node, pp.BinaryExpr):
        _collect_inputs(node.lhs, reach, inputs)
        _collect_inputs(node.rhs, reach, inputs)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _collect_inputs(arg, reach, inputs)
    elif isinstance(node, pp.AggregateExpr):
        _collect_inputs(node.expr, reach, inputs)
        if node.param is not None:
            _collect_inputs(node.param, reach, inputs)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        _collect_inputs(node.expr, reach, inputs)


@lru_cache(maxsize=1024)
def join_labels(exprs: tuple[str, ...]) -> tuple[frozenset[str] | None, frozenset[str]]:
    """How the series of ``exprs`` are joined to their result: the labels of every
    ``on (...)`` of their binary operations (None: there is none) and of every
    ``ignoring (...)``. A stale series is attributed to the targets that share its values of
    those labels (``gpuops.model.staleness``): joined ``on (uuid)``, a series of another job
    still belongs to its GPU's target."""
    on: set[str] | None = None
    ignoring: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        nonlocal on
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                if matching.type == promql_parser.LabelModifierType.Include:
                    on = (on or set()) | set(matching.labels)
                else:
                    ignoring.update(matching.labels)
        return True

    for expr in exprs:
        try:
            promql_parser.walk(promql_parser.parse(expr), visit)
        except ValueError as exc:
            raise QueryError(f"cannot tell how {expr!r} joins its series: {_cap(exc)}") from exc
    return (frozenset(on) if on is not None else None), frozenset(ignoring)


def _windowed(selector: str, window_s: float) -> str:
    return f"{selector}[{_duration(window_s)}]"


def _duration(seconds: float) -> str:
    """``seconds`` as a PromQL duration (whole milliseconds when not whole seconds; at least
    one: Prometheus refuses a range of 0)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def split_input(text: str) -> tuple[str, float | None]:
    """An ``input_selectors`` input as (selector, window in seconds; None: instant). A
    selector's text ends with ``}``; a window is the last ``[...]``."""
    if not text.endswith("]"):
        return text, None
    selector, _, window = text[:-1].rpartition("[")
    ms = window[:-2] if window.endswith("ms") else None
    return selector, int(ms) / 1000 if ms is not None else float(window[:-1])


_MATCH_OPS = (
    (promql_parser.MatchOp.Equal, "="),
    (promql_parser.MatchOp.NotEqual, "!="),
    (promql_parser.MatchOp.Re, "=~"),
    (promql_parser.MatchOp.NotRe, "!~"),
)


def string_literal(value: str) -> str:
    """``value`` as a PromQL string literal ("labels are data": quotes, backslashes and control
    characters escaped as Go's ``strconv.Unquote``, which Prometheus uses, reads them)."""
    return json.dumps(value, ensure_ascii=False)


def regex_literal(value: str) -> str:
    """A RE2 pattern that matches exactly ``value``."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value)


def selector_text(node: promql_parser.VectorSelector, extra: Iterable[str] = ()) -> str:
    """``node`` as PromQL (its offset and ``@`` left out), with the matchers ``extra`` (PromQL
    text) added (to each ``or`` group of a selector that has them, MetricsQL's
    ``{a="1" or b="2"}``). Written here, not with ``str(node)``: promql-parser prints matcher
    values without escaping them (``{a="q\\""}`` comes back as ``{a="q""}``) and an ``or``
    selector as ``{ or a="1" or b="2"}``."""
    extra = tuple(extra)
    groups = node.matchers.or_matchers or [node.matchers.matchers]
    text = " or ".join(",".join([*map(_matcher_text, group), *extra]) for group in groups)
    return f"{node.name or ''}{{{text}}}"


def _matcher_text(m: promql_parser.Matcher) -> str:
    op = next((text for kind, text in _MATCH_OPS if m.op == kind), None)
    if op is None:
        raise QueryError(f"unknown label matcher {m.op} on {m.name}")
    return f"{m.name}{op}{string_literal(m.value)}"


NARROW_MAX_TARGETS = 1000
"""``narrowed`` restricts a query to at most this many targets' label values; past that the
wide query is cheaper than matching the values (and its text would pass 40 kB)."""

_LOCAL_FUNCTIONS = frozenset(
    {f"{agg}_over_time" for agg in ("avg", "min", "max", "sum", "count", "last", "stddev")}
    | {"stdvar_over_time", "quantile_over_time", "present_over_time", "rate", "irate"}
    | {"increase", "delta", "idelta", "deriv", "predict_linear", "changes", "resets", "abs"}
    | {"ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp"}
    | {"clamp_min", "clamp_max", "timestamp", "time", "histogram_quantile"}
)
"""Functions whose result for a series depends on that series alone (and keep its labels)."""


def narrowed(expr: str, names: Sequence[str], targets: Iterable[Mapping[str, str]]) -> str | None:
    """``expr`` read only for ``targets`` (their values of the labels ``names``): every vector
    selector gets ``name=~"v1|v2|..."`` per label (values escaped), so Prometheus reads only
    those series. Sound only when each output series of ``expr`` depends on input series with
    the same values of ``names``; ``expr`` must be made of selectors, numbers, per-series
    functions (``_LOCAL_FUNCTIONS``), aggregations ``by`` all of ``names`` (or ``without``
    none of them) and binary operators that match on all of ``names`` — else None (as when
    there are more than ``NARROW_MAX_TARGETS`` targets, or none: ask the wide query). The
    answer may hold more series than ``targets`` (every combination of the values).
    ``__name__`` is left out of ``names``: a target does not keep it (``Target.from_labels``),
    so its values would all be ``""``, which no series has."""
    names = [n for n in names if n != "__name__"]
    wanted = [dict.fromkeys(t.get(n, "") for t in targets) for n in names]
    if not names or not wanted[0] or max(len(v) for v in wanted) > NARROW_MAX_TARGETS:
        return None
    extra = [
        f"{name}=~{string_literal('|'.join(regex_literal(v) for v in values))}"
        for name, values in zip(names, wanted, strict=True)
    ]
    try:
        return _render(promql_parser.parse(expr), frozenset(names), extra)
    except (ValueError, _NotLocal):
        return None


class _NotLocal(Exception):
    """``narrowed`` cannot restrict this expression soundly."""


def _render(node: promql_parser.Expr, names: frozenset[str], extra: Sequence[str]) -> str:
    pp = promql_parser
    if isinstance(node, pp.VectorSelector):
        # ``or`` groups (MetricsQL's ``{a="1" or b="2"}``): not narrowed, the wide query
        if node.offset is not None or node.at is not None or node.matchers.or_matchers:
            raise _NotLocal
        return selector_text(node, extra)
    if isinstance(node, pp.MatrixSelector):
        inner = _render(node.vector_selector, names, extra)
        return f"{inner}[{pp.display_duration(node.range)}]"
    if isinstance(node, pp.NumberLiteral):
        value = float(node.val)
        if value != value or value in (math.inf, -math.inf):
            raise _NotLocal
        return repr(value)
    if isinstance(node, pp.ParenExpr):
        return f"({_render(node.expr, names, extra)})"
    if isinstance(node, pp.UnaryExpr):
        return f"-({_render(node.expr, names, extra)})"
    if isinstance(node, pp.Call):
        if node.func.name not in _LOCAL_FUNCTIONS:
            raise _NotLocal
        return f"{node.func.name}({', '.join(_render(a, names, extra) for a in node.args)})"
    if isinstance(node, pp.AggregateExpr):
        mod = node.modifier
        if mod is None or node.param is not None and not isinstance(node.param, pp.NumberLiteral):
            raise _NotLocal
        by = mod.type == pp.AggModifierType.By
        if (by and not names <= set(mod.labels)) or (not by and names & set(mod.labels)):
            raise _NotLocal
        clause = f"{'by' if by else 'without'} ({', '.join(mod.labels)})"
        param = f"{_render(node.param, names, extra)}, " if node.param is not None else ""
        return f"{node.op} {clause} ({param}{_render(node.expr, names, extra)})"
    if isinstance(node, pp.BinaryExpr):
        bin_mod = node.modifier
        matching = bin_mod.matching if bin_mod is not None else None
        if matching is not None:
            on = matching.type == pp.LabelModifierType.Include
            if (on and not names <= set(matching.labels)) or (
                not on and names & set(matching.labels)
            ):
                raise _NotLocal
        lhs, rhs = _render(node.lhs, names, extra), _render(node.rhs, names, extra)
        modifier = f"{bin_mod} " if bin_mod is not None and str(bin_mod) else ""
        return f"({lhs}) {node.op} {modifier}({rhs})"
    raise _NotLocal


@lru_cache(maxsize=1024)
def stale_expr(inputs: tuple[str, ...], bound_s: float) -> str | None:
    """One query for the series of each of ``inputs`` whose newest sample is older than
    ``bound_s``, labelled with the input's index (``AGE_LABEL``). An instant selector's series
    are those it reads with a sample older than the bound (``time() - timestamp(s) > bound``:
    the value is the age); a windowed one's, those with a sample in the window and none within
    the bound (``last_over_time(s[window]) unless last_over_time(s[bound])``: ``timestamp()``
    of a function's result is the evaluation time, not the sample's, so the age cannot be
    asked; the value is the series' last one). A window no longer than the bound cannot read
    a stale sample and is not asked. A selector without a literal metric name
    (``{__name__=~"a|b"}``) has its series' names copied into ``NAME_LABEL`` on both sides,
    since ``unless`` (and ``timestamp``) leave ``__name__`` out: ``a`` and ``b`` with the same
    other labels are two series. None: nothing to ask (no input, or no bound)."""
    if not math.isfinite(bound_s):
        return None
    parts = []
    for i, text in enumerate(inputs):
        selector, window = split_input(text)
        recent = f"last_over_time({_windowed(selector, bound_s)})"
        if selector.startswith("{"):
            read = text if window is None else f"last_over_time({text})"
            if window is not None and window <= bound_s:
                continue
            part = f"{_named(read)} unless {_named(recent)}"
        elif window is None:
            part = f"time() - timestamp({selector}) > {bound_s!r}"
        elif window > bound_s:
            part = f"last_over_time({text}) unless {recent}"
        else:
            continue
        parts.append(f'label_replace({part}, "{AGE_LABEL}", "{i}", "", "")')
    return " or ".join(parts) or None


NAME_LABEL = "gpuops_name"
"""The label a stale series of a selector without a literal metric name carries its name in."""


def _named(expr: str) -> str:
    return f'label_replace({expr}, "{NAME_LABEL}", "$1", "__name__", "(.+)")'


def parse_vector(raw: Any, expr: str) -> tuple[Sample, ...]:
    """Turn the ``data.result`` of an instant query into samples (a scalar gives one sample)."""
    return tuple(decode_vector(raw, expr))


_METRIC, _VALUE = itemgetter("metric"), itemgetter("value")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_NUMERIC, _OBJECT, _PAIR = frozenset({float, int}), frozenset({dict}), {2}


def decode_vector(raw: Any, expr: str) -> Vector:
    """``parse_vector`` as columns (``gpuops.model.decisions.Vector``): ``raw`` is the decoder's
    own (its ``metric`` objects become the labels, not copied). Checked in passes that run in
    C, with no Python code per series (issue 15: building and checking a ``Sample`` per
    series was, after the JSON decoding itself, the largest part of a steady round): every
    ``metric`` an object, every timestamp a JSON number, every value a number as Prometheus
    writes it (``_NUMBER``); anything else goes to the careful pass, which says what and
    where. A label value that is not a string is made one when its sample is read
    (``Vector``), as the careful pass does."""
    if isinstance(raw, list) and len(raw) == 2 and not isinstance(raw[0], dict):
        return Vector([{}], [_float(raw[1])], [_time(raw[0])])
    if not isinstance(raw, list):
        raise QueryError(f"{expr!r} did not return a vector")
    if not raw:
        return Vector([], [], [])
    try:
        metrics = list(map(_METRIC, raw))
        if not set(map(type, metrics)) <= _OBJECT:
            raise TypeError
        pairs = list(map(_VALUE, raw))
        if set(map(len, pairs)) != _PAIR:
            raise ValueError
        times, texts = list(map(_FIRST, pairs)), list(map(_SECOND, pairs))
        if not set(map(type, times)) <= _NUMERIC:  # not `true` (bool), not a string
            raise ValueError
        joined = "\n".join(texts)  # TypeError unless every value is a string
        # one match for all values; a value holding "\n" between two numbers fails float()
        if _NUMBERS.fullmatch(joined) is None:
            raise ValueError
        values = list(map(float, texts))
    except (KeyError, TypeError, ValueError, AttributeError):
        return _parse_carefully(raw, expr)
    if "NaN" in joined:  # NaN samples are left out, as before
        kept = [i for i, v in enumerate(values) if v == v]
        kept_times = [float(times[i]) for i in kept]
        return Vector([metrics[i] for i in kept], [values[i] for i in kept], kept_times)
    return Vector(metrics, values, list(map(float, times)))


def _parse_carefully(raw: list[Any], expr: str) -> Vector:
    """``parse_vector`` for an answer its fast pass could not read: a missing ``metric`` is
    no labels, a label value that is not a string is made one, anything else is a
    ``QueryError`` naming the series."""
    samples = []
    for item in raw:
        try:
            ts, value = item["value"]
            labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
            ts = _time(ts)
        except (KeyError, TypeError, ValueError, AttributeError, QueryError) as exc:
            raise QueryError(f"{expr!r} returned a malformed series: {item!r:.200}") from exc
        v = _float(value)
        if not math.isnan(v):
            samples.append((labels, v, ts))
    return Vector([s[0] for s in samples], [s[1] for s in samples], [s[2] for s in samples])


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|NaN|[+-]Inf")
"""A sample value as the Prometheus HTTP API writes it (a JSON string: Go's ``strconv``
format, ``NaN``, ``+Inf``, ``-Inf``). Python's ``float()`` takes more (``" 1_0 "``, ``"nan"``,
``"infinity"``, other scripts' digits): none of that is a value Prometheus sent."""

_NUMBERS = re.compile(f"(?:{_NUMBER.pattern})(?:\n(?:{_NUMBER.pattern}))*")
"""``_NUMBER``s joined by newlines: all values of an answer checked in one match."""


_SAMPLE = re.compile(
    rb',"value":\[(-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?),'
    rb'"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]Inf)"\]\}'
)
"""A sample's value as Prometheus writes it at the end of its series (``Answers``): the
time (a JSON number, by JSON's grammar, not ``01``, and finite as a float: at most 16
digits before its point and an exponent of two, not ``1e400``, which the full decoding
refuses, review 15e) and the value (a ``_NUMBER`` other
than ``NaN``), each captured. A sample whose value is anything else (``NaN``, text) is not
split off: its series' skeleton differs from any remembered one, so it takes the full
decoding."""


def _float(value: Any) -> float:
    """A sample value (``_NUMBER``), else a ``QueryError`` naming it."""
    if type(value) is not str or _NUMBER.fullmatch(value) is None:
        raise QueryError(f"not a number: {value!r:.50}")
    return float(value)


def _time(value: Any) -> float:
    """A sample's timestamp (a JSON number), else a ``QueryError`` naming it."""
    if type(value) is not float and type(value) is not int:
        raise QueryError(f"not a timestamp: {value!r:.50}")
    return float(value)


def _http_error(status: int, body: bytes) -> str:
    """``HTTP 400: invalid parameter "query": ...`` from an answer that is not a 200: its
    ``error``, decoded (review 15d: read by ``_api_error`` out of the body's repr, a
    Prometheus parse error was cut at its first escaped quote, ``invalid parameter \\``);
    the body itself, capped, when it holds none (a proxy's HTML page)."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, str):
        return f"HTTP {status}: {error}"[:MAX_ERROR_CHARS]
    return _cap(f"HTTP Status Code {status} ({body!r})")


def _api_error(exc: BaseException) -> str:
    """``HTTP 400: parse error: ...`` out of the client's ``HTTP Status Code 400 (b'{json}')``."""
    text = str(exc)
    status = re.search(r"Status Code (\d+)", text)
    error = re.search(r'"error":\s*"((?:[^"\\]|\\.)*)"', text)
    if status and error:
        return f"HTTP {status.group(1)}: {error.group(1)}"[:MAX_ERROR_CHARS]
    return _cap(exc)


def _cap(exc: BaseException | str) -> str:
    text = str(exc)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"
