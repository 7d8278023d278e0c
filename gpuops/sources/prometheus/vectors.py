"""Instant query answers decoded into columns (``gpuops.model.decisions.Vector``).

Called by ``gpuops.sources.prometheus.client`` for every answer ``Answers`` does not
recognise (``decode_answer``) and for the samples of range queries (``sample_value``,
``sample_time``). The answer is Prometheus' JSON (``data.result``): checked in passes that
run in C, with no Python code per series; anything out of the ordinary goes to a careful
pass that says what and where (``QueryError``).
"""

from __future__ import annotations

import math
import re
from operator import itemgetter
from typing import Any

import orjson

from gpuops.model.decisions import Sample, Vector
from gpuops.sources.errors import QueryError

NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|NaN|[+-]Inf")
"""A sample value as the Prometheus HTTP API writes it (a JSON string: Go's ``strconv``
format, ``NaN``, ``+Inf``, ``-Inf``). Python's ``float()`` takes more (``" 1_0 "``, ``"nan"``,
``"infinity"``, other scripts' digits): none of that is a value Prometheus sent."""

_NUMBERS = re.compile(f"(?:{NUMBER.pattern})(?:\n(?:{NUMBER.pattern}))*")
"""``NUMBER``s joined by newlines: all values of an answer checked in one match."""

_METRIC, _VALUE = itemgetter("metric"), itemgetter("value")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_NUMERIC, _OBJECT, _PAIR = frozenset({float, int}), frozenset({dict}), {2}


def decode_answer(body: bytes, expr: str) -> Vector:
    """``body`` decoded in full (``decode_vector``); ``ValueError`` when it is not an answer."""
    try:
        raw = orjson.loads(body)["data"]["result"]
    except (KeyError, TypeError) as exc:
        raise ValueError("not a query answer") from exc
    return decode_vector(raw, expr)


def parse_vector(raw: Any, expr: str) -> tuple[Sample, ...]:
    """Turn the ``data.result`` of an instant query into samples (a scalar gives one sample)."""
    return tuple(decode_vector(raw, expr))


def decode_vector(raw: Any, expr: str) -> Vector:
    """``parse_vector`` as columns: ``raw`` is the decoder's own (its ``metric`` objects
    become the labels, not copied). Checked in passes that run in C, with no Python code per
    series (a ``Sample`` built and checked per series would be, after the JSON decoding
    itself, the largest part of a steady evaluation): every ``metric`` an object, every
    timestamp a JSON number, every value a number as Prometheus writes it (``NUMBER``);
    anything else goes to the careful pass, which says what and where. A label value that is
    not a string is made one when its sample is read (``Vector``), as the careful pass does.
    ``NaN`` samples are left out."""
    if isinstance(raw, list) and len(raw) == 2 and not isinstance(raw[0], dict):
        return Vector([{}], [sample_value(raw[1])], [sample_time(raw[0])])
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
    if "NaN" in joined:  # NaN samples are left out
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
            ts = sample_time(ts)
        except (KeyError, TypeError, ValueError, AttributeError, QueryError) as exc:
            raise QueryError(f"{expr!r} returned a malformed series: {item!r:.200}") from exc
        v = sample_value(value)
        if not math.isnan(v):
            samples.append((labels, v, ts))
    return Vector([s[0] for s in samples], [s[1] for s in samples], [s[2] for s in samples])


def sample_value(value: Any) -> float:
    """A sample value (``NUMBER``), else a ``QueryError`` naming it."""
    if type(value) is not str or NUMBER.fullmatch(value) is None:
        raise QueryError(f"not a number: {value!r:.50}")
    return float(value)


def sample_time(value: Any) -> float:
    """A sample's timestamp (a JSON number), else a ``QueryError`` naming it."""
    if type(value) is not float and type(value) is not int:
        raise QueryError(f"not a timestamp: {value!r:.50}")
    return float(value)
