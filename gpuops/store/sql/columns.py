"""The text of the two JSON columns written most often: a target's row (``policy_targets.data``,
every changed target of an evaluation) and a decision's (``decisions.data``). orjson writes
them (C, compact, UTF-8: about three times cheaper than ``json.dumps`` of the document) where it
writes what ``json.loads`` reads back as the values ``json.dumps`` would have given; else
``json.dumps`` of the codec's document (``gpuops.store.codecs``). Used by
``gpuops.store.sql.policy_states`` and ``gpuops.store.sql.decisions``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from gpuops.model.decisions import Decision
from gpuops.model.evaluation.state import TargetState
from gpuops.model.records import decision_doc
from gpuops.store.codecs import target_state_doc


def _exact(value: Any) -> bool:
    """Whether orjson writes ``value`` so that ``json.loads`` reads back what it reads back
    from ``json.dumps``: only JSON's own types (orjson also writes dates, datetimes, UUIDs and
    enums, which ``json.dumps`` refuses: those take ``json.dumps``, which raises, so such a
    decision is not recorded and does not run), and no NaN or Infinity (orjson writes them as
    ``null``)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return bool(value - value == 0.0)  # False for NaN and the infinities
    if isinstance(value, Mapping):
        return all(_exact(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_exact(v) for v in value)
    return False


def _finite(*values: float | None) -> bool:
    """Whether none of ``values`` (numbers or None) is NaN or an infinity."""
    for v in values:  # a loop, not ``all`` over a generator: ~3x cheaper
        if v is not None and v - v != 0.0:
            return False
    return True


def _mapping(value: Any) -> Any:
    """orjson's ``default``: the read-only mappings (``freeze``) of the documents."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(type(value).__name__)


def target_data(t: TargetState) -> str:
    """The ``policy_targets`` data of ``t``: the values of ``target_state_doc`` (orjson writes
    a dataclass' fields in their order: the same keys in the same order; a test checks it),
    read back by ``json.loads`` to the same values. ``json.dumps`` where orjson would not
    write the same values (NaN, Infinity: it writes ``null``) or refuses (a lone surrogate, an
    integer beyond 64 bits)."""
    if _finite(
        t.value,
        t.active_since,
        t.last_seen,
        t.fired_at,
        t.last_fire_at,
        t.absent_since,
        t.retry_at,
        t.held_since,
    ):
        try:
            return orjson.dumps(t, default=_mapping).decode()
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(target_state_doc(t))


def decision_data(decision: Decision) -> str:
    """The ``decisions`` data of ``decision`` (``decision_doc``), written as ``target_data``
    writes a target's: orjson where it writes the same values, else ``json.dumps``."""
    doc = decision_doc(decision)
    ev = decision.evidence
    action = doc["action"]
    if _finite(
        ev.value, ev.pending_since, ev.observed_at, decision.at, decision.episode_start
    ) and (action is None or _exact(action["params"])):
        try:
            return orjson.dumps(doc, default=_mapping).decode()
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(doc)
