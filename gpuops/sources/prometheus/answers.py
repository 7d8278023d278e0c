"""Answers recognised again: the last answer to each query, so that the next one with the
same series costs the reading of its values only.

Owned by ``gpuops.sources.prometheus.client.PrometheusClient`` (one ``Answers`` per client;
the engine's policies ask the same queries every evaluation and most answers keep their
series). What is not recognised is decoded in full (``gpuops.sources.prometheus.vectors``),
so the vector handed back is always what a full decoding gives.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gpuops.model.decisions import Vector


class Answers:
    """The last answer to each query whose series can be recognised again (JSON decoding
    would otherwise be most of a steady evaluation): an answer is split at its samples'
    values, in C (``_SAMPLE``: ``,"value":[time,"number"]}``); when what is left (every byte
    but the values) is the same as in the query's last answer, its series are the same, in
    the same order, and only the values are read: no ``metric`` object decoded, the target
    keys made once (``Vector.with_columns``). An answer is remembered only when the split is
    sound: it has exactly one ``"value"`` token per series (a quote inside a JSON string is
    escaped, so none hides in a label; a label valued ``value`` makes the answer not
    remembered), each sample's value and time are those the full decoding read, and no
    value is ``NaN`` (left out by ``decode_vector``). A value that is not a number as
    Prometheus writes it, or ``NaN``, is not split off (``_SAMPLE``): such an answer's
    skeleton is no remembered one's, and the full decoding names it.

    An answer whose series changed a little (a ``util < 0.2`` whose targets come and go: at
    most ``MEND_SHARE`` of its series, or ``MEND_MIN``, not in the last answer) is mended
    (``_mended``): each series' text (its ``{"metric":{...}`` between two samples) that is
    byte for byte one of the last answer's takes that series' labels, and only the others
    are decoded, one by one (with 1 % of the GPUs changing state an evaluation, the full
    decoding of the churning answers would be a fifth of an evaluation at 50,000 GPUs). It
    is then what a full decoding gives: the text around the series is the last answer's,
    and each text between two samples is one of its series' or decodes, closed, to an
    object holding only ``metric``, an object (one series); anything else takes the full
    decoding. An answer whose series changed more costs one split and one full decoding
    (the split is reused to remember it). A query whose series changed so ``MISSES``
    answers in a row is forgotten and its next ``PAUSE`` answers are decoded in full
    without splitting (as without this cache), then it is tried again: such a query costs
    what a full decoding does and keeps no memory."""

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
        metrics: list[Any] = list(map(pieces.get, texts))  # labels, or None: a new series
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
        # only where the answer has one: of two (a duplicate key) orjson keeps the last, and
        # a head cut at the first would read another array's series
        once = start >= 0 and first.count(_RESULT) == 1
        self.head = first[: start + len(_RESULT)] if once else b""
        self._pieces: dict[bytes, Mapping[str, str]] | None = None

    def pieces(self) -> dict[bytes, Mapping[str, str]] | None:
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

_SAMPLE = re.compile(
    rb',"value":\[(-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?),'
    rb'"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]Inf)"\]\}'
)
"""A sample's value as Prometheus writes it at the end of its series (``Answers``): the
time (a JSON number, by JSON's grammar, not ``01``, and finite as a float: at most 16
digits before its point and an exponent of two, not ``1e400``, which the full decoding
refuses) and the value (a ``vectors.NUMBER`` other than ``NaN``), each captured. A sample
whose value is anything else (``NaN``, text) is not split off: its series' skeleton differs
from any remembered one, so it takes the full decoding."""


def _series_metric(text: bytes) -> dict[str, Any] | None:
    """The labels of a series whose text (``,{"metric":{...}``, up to its sample) is
    ``text``, as JSON decodes them: None unless, closed, it is a JSON object holding only
    ``metric``, an object."""
    if text[:1] != b",":  # the comma between two series ("}" or " " there is not JSON,
        return None  # which the full decoding refuses)
    try:
        series = orjson.loads(text[1:] + b"}")
    except orjson.JSONDecodeError:
        return None
    if type(series) is not dict or len(series) != 1:
        return None
    metric = series.get("metric")
    return metric if type(metric) is dict else None
