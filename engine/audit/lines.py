"""Spool entries: each document as its bulk action line and its JSON line (spool format 2).

Built by ``engine.audit.log.AuditLog`` (``decision_entry`` for the decisions of the cycle and
the gate, ``entry`` for any other document), written as they are by ``engine.audit.spool`` and
sent as they are by ``engine.audit.shipper``: a segment of format 2 is a ready ``_bulk`` body,
so the shipper parses nothing and encodes nothing per document.

``decision_entry`` writes the JSON of ``engine.audit.documents.decision_document`` directly,
byte for byte what ``encode_line`` makes of that document (``tests/unit/audit/
test_document_reference.py`` compares them for every shape of decision and outcome): the parts
that are the same for every decision are encoded once, the rest value by value with orjson.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import orjson

from engine.audit.documents import (
    DECISION_DATASET,
    ECS_VERSION,
    _plain,
    _plain_params,
    decision_document,
    decision_message,
    event_id,
    iso,
    outcome_fields,
    stream_of,
)
from engine.decisions import Decision, Outcome

_dumps = orjson.dumps


def _default(value: Any) -> Any:
    """What orjson cannot serialize by itself: read-only mappings and other sequences."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | list | frozenset | set):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_line(doc: Mapping[str, Any]) -> bytes:
    """One document as compact UTF-8 JSON and a newline.

    orjson (C) instead of ``json.dumps``: 5-10x cheaper per document, and the same JSON values
    (keys in insertion order, non-ASCII as UTF-8). An integer beyond 64 bits or anything else
    orjson refuses falls back to ``json.dumps``. (The documents carry no NaN or Infinity:
    ``engine.audit.documents`` turns them into null, as JSON has neither.)"""
    try:
        return orjson.dumps(doc, default=_default, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=_default)
        return (text + "\n").encode()


def action_line(stream: str, doc_id: str) -> bytes:
    """The bulk action line of a document: ``create`` (a second copy is a 409) by its id."""
    return b'{"create":{"_index":' + _dumps(stream) + b',"_id":' + _dumps(doc_id) + b"}}\n"


def entry(doc: Mapping[str, Any]) -> tuple[str, bytes]:
    """A document's ``event.id`` and spool entry (its action line, then its line)."""
    doc_id = str(doc["event"]["id"])
    return doc_id, action_line(stream_of(doc), doc_id) + encode_line(doc)


@functools.lru_cache(maxsize=4096)
def _iso_json(ts: float) -> bytes:
    return _dumps(iso(ts))


@functools.lru_cache(maxsize=256)
def _constant(namespace: str, host_name: str) -> tuple[bytes, bytes, bytes]:
    """What every decision document of one engine shares: the action line's start, the
    document's part from ``ecs`` up to ``event.created``, and ``host``."""
    stream = _dumps(f"logs-{DECISION_DATASET}-{namespace}")
    ns = _dumps(namespace)
    head = (
        b',"ecs":{"version":' + _dumps(ECS_VERSION) + b'},"data_stream":'
        b'{"type":"logs","dataset":' + _dumps(DECISION_DATASET) + b',"namespace":' + ns + b"},"
        b'"event":{"kind":"event","dataset":' + _dumps(DECISION_DATASET) + b',"module":"gpuops",'
        b'"created":'
    )
    return b'{"create":{"_index":' + stream + b',"_id":"', head, _dumps({"name": host_name})


@functools.lru_cache(maxsize=4096)
def _rule(policy: str, group: str) -> bytes:
    return _dumps({"name": policy, "ruleset": group})


@functools.lru_cache(maxsize=1024)
def _string(text: str) -> bytes:
    """A JSON string of the few texts every decision of a policy repeats (its query...)."""
    return _dumps(text)


_PARAMS: dict[int, tuple[Mapping[str, Any], bytes]] = {}


def _params(params: Mapping[str, Any]) -> bytes:
    """The JSON of an action's params: a policy's decisions share one ``ActionSpec`` and so
    one params mapping (read-only), encoded once (by identity; the entry keeps the mapping
    alive, so its id is not reused while cached)."""
    cached = _PARAMS.get(id(params))
    if cached is not None and cached[0] is params:
        return cached[1]
    data = _dumps(_plain_params(params))
    if len(_PARAMS) >= 1024:
        _PARAMS.clear()
    _PARAMS[id(params)] = (params, data)
    return data


_STR = {str}


def decision_entry(
    decision: Decision, outcome: Outcome | None, host_name: str, namespace: str, now: float
) -> tuple[str, bytes]:
    """``entry(decision_document(...))``, built without the document (the audit's hot path:
    one per decision and outcome)."""
    try:
        return _decision_entry(decision, outcome, host_name, namespace, now)
    except (TypeError, ValueError):  # what orjson refuses (an integer beyond 64 bits...)
        return entry(decision_document(decision, outcome, host_name, namespace, now))


def _decision_entry(
    decision: Decision, outcome: Outcome | None, host_name: str, namespace: str, now: float
) -> tuple[str, bytes]:
    verdict: str = decision.verdict._value_  # the enums' text (``.value`` is a slow property)
    transition: str = decision.transition._value_
    spec = decision.action
    reason = decision.reason
    status, ecs_outcome, executed = outcome_fields(verdict, outcome)
    doc_id = event_id(decision.id, verdict, status)
    action_start, head, host = _constant(namespace, host_name)
    labels = dict(decision.target.labels)
    if {*map(type, labels), *map(type, labels.values())} - _STR:
        labels = {str(k): str(v) for k, v in labels.items()}
    labels_json = _dumps(labels)
    parts = [
        action_start,
        doc_id.encode(),
        b'"}}\n',
        b'{"@timestamp":',
        _iso_json(decision.at),
        head,
        _iso_json(now),
        b',"id":"',
        doc_id.encode(),
        b'","category":["host"],"type":',
        b'["change"],"action":' if executed else b'["info"],"action":',
        _string(spec.type if spec is not None else transition),
        b',"outcome":"',
        ecs_outcome.encode(),
        b'"',
    ]
    if reason:
        parts += (b',"reason":', _dumps(reason))
    if outcome is not None and math.isfinite(outcome.duration_s):
        parts += (b',"duration":', _dumps(int(round(outcome.duration_s * 1e9))))
    message = decision_message(decision, labels, transition, verdict, status, outcome)
    parts += (
        b'},"message":',
        _dumps(message),
        b',"rule":',
        _rule(decision.policy, decision.group),
        b',"host":',
        host,
        b',"labels":',
        labels_json,
    )
    if outcome is not None and outcome.error:
        parts += (b',"error":{"message":', _dumps(outcome.error), b"}")
    parts += (
        b',"gpuops":{"decision":{"id":',
        _dumps(decision.id),
        b',"episode_start":',
        _iso_json(decision.episode_start),
        b',"repeat":',
        _dumps(decision.repeat),
    )
    if decision.held_repeats:
        parts += (b',"held_repeats":', _dumps(decision.held_repeats))
    evidence = decision.evidence
    value = evidence.value
    parts += (
        b'},"verdict":',
        _dumps(verdict),
        b',"reason":',
        _dumps(reason),
        b',"transition":',
        _string(transition),
        b',"mode":',
        _string(decision.mode),
        b',"target":{"key":',
        _dumps(decision.target.key),
        b',"labels":',
        labels_json,
        b'},"evidence":{"expr":',
        _string(evidence.expr),
        b',"value":',
        _dumps(value if value is not None and math.isfinite(value) else None),
        b',"observed_at":',
        _iso_json(evidence.observed_at),
    )
    if evidence.pending_since is not None:
        parts += (b',"pending_since":', _iso_json(evidence.pending_since))
    parts.append(b"}")
    if decision.labels:
        policy_labels = {str(k): str(v) for k, v in decision.labels.items()}
        parts += (b',"policy":{"labels":', _dumps(policy_labels), b"}")
    if spec is not None:
        parts += (
            b',"executor":',
            _string(spec.executor),
            b',"action":{"type":',
            _string(spec.type),
            b',"params":',
            _params(spec.params),
            b"}",
        )
    if outcome is not None:
        parts += (
            b',"outcome":{"status":',
            _dumps(status),
            b',"attempts":',
            _dumps(outcome.attempts),
            b',"changed":',
            _dumps(_plain(outcome.changed)),
            b"}",
        )
    parts.append(b"}}\n")
    return doc_id, b"".join(parts)
