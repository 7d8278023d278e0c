"""Spool entries: each document as its bulk action line and its JSON line (spool format 2).

Built by ``gpuops.audit.log.AuditLog`` (``decision_entry`` for the decisions of the cycle and
the gate, ``entry`` for any other document), written as they are by ``gpuops.audit.spool`` and
sent as they are by ``gpuops.audit.shipping``: a segment of format 2 is a ready ``_bulk`` body,
so the shipper parses nothing and encodes nothing per document.

``decision_entry`` writes the JSON of ``gpuops.audit.documents.decision_document`` directly,
byte for byte what ``encode_line`` makes of that document (``tests/unit/audit/
test_document_reference.py`` compares them for every shape of decision and outcome): the parts
that are the same for every decision are encoded once, the rest value by value with orjson.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import orjson

from gpuops.audit.documents import (
    DECISION_DATASET,
    ECS_VERSION,
    _plain,
    _plain_params,
    decision_document,
    iso_json,
    outcome_fields,
    outcome_told,
    stream_of,
)
from gpuops.model.decisions import ActionSpec, Decision, Outcome

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
    ``gpuops.audit.documents`` turns them into null, as JSON has neither.)"""
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
    return _remember(_PARAMS, params, _dumps(_plain_params(params)))


def _remember(
    cache: dict[int, tuple[Mapping[str, Any], bytes]], mapping: Mapping[str, Any], data: bytes
) -> bytes:
    """Keep ``data`` as ``mapping``'s encoding in an identity cache (``_PARAMS``,
    ``_POLICY_LABELS``): only a read-only mapping, which cannot change; at most 1024 kept."""
    if type(mapping) is not MappingProxyType:  # a mutable mapping may change: not cached
        return data
    if len(cache) >= 1024:
        cache.clear()
    cache[id(mapping)] = (mapping, data)
    return data


_STR = {str}
_sha256 = hashlib.sha256
_TARGET_TEXTS: dict[tuple[str, ...], tuple[Callable[[Mapping[str, str]], Any], str]] = {}


def _target_text(labels: dict[str, str]) -> str | None:
    """``decision_message``'s text of a target's labels (``k=v, ...`` sorted by name), or None
    when a key or value is not a plain ``str`` (the document path converts those): a format
    and an ``itemgetter`` per tuple of label names, made once, so a target costs one ``%``."""
    names = tuple(labels)
    made = _TARGET_TEXTS.get(names)
    if made is None:
        order = sorted(names)
        if len(_TARGET_TEXTS) >= 1024:
            _TARGET_TEXTS.clear()
        getter: Callable[[Mapping[str, str]], Any] = (
            itemgetter(*order) if len(order) > 1 else lambda m: tuple(m[k] for k in order)
        )
        text = ", ".join(f"{k.replace('%', '%%')}=%s" for k in order)
        made = _TARGET_TEXTS[names] = (getter, text)
    getter, text = made
    values = getter(labels)
    if not {*map(type, names), *map(type, values)} <= _STR:
        return None
    formatted: str = text % values
    return formatted


def decision_entry(
    decision: Decision, outcome: Outcome | None, host_name: str, namespace: str, now: float
) -> tuple[str, bytes]:
    """``entry(decision_document(...))``, built without the document (the audit's hot path:
    one per decision and outcome)."""
    try:
        built = _decision_entry(decision, outcome, host_name, namespace, now)
    except (TypeError, ValueError):  # what orjson refuses (an integer beyond 64 bits...)
        built = None
    if built is None:  # or labels that are not plain strings
        return entry(decision_document(decision, outcome, host_name, namespace, now))
    return built


def _decision_entry(
    decision: Decision, outcome: Outcome | None, host_name: str, namespace: str, now: float
) -> tuple[str, bytes] | None:
    verdict: str = decision.verdict._value_  # the enums' text (``.value`` is a slow property)
    transition: str = decision.transition._value_
    spec = decision.action
    reason = decision.reason
    status, ecs_outcome, executed = outcome_fields(verdict, outcome)
    doc_id = _sha256(f"{decision.id}\x1f{verdict}\x1f{status}".encode()).hexdigest()[:32]
    evidence = decision.evidence
    key = (
        namespace,
        host_name,
        verdict,
        transition,
        ecs_outcome,
        executed,
        decision.policy,
        decision.group,
        decision.mode,
        evidence.expr,
        spec.type if spec is not None else transition,
    )
    template = _template(key)
    labels = decision.target.labels
    labels = labels.copy() if type(labels) is MappingProxyType else dict(labels)
    if type(labels) is not dict:
        labels = dict(labels)
    target = _target_text(labels) if labels else ""
    if target is None:
        return None
    labels_json = _dumps(labels)
    value = evidence.value
    id_bytes = doc_id.encode()
    reason_json = _dumps(reason)
    # the message (``decision_message``): its policy, transition and verdict are in the
    # template; a JSON string's escapes are per character, so its pieces are encoded apart
    tail = b" (" + reason_json[1:-1] + b")" if reason else b""
    if outcome is not None:
        said = f", {status}: {outcome.error}" if outcome.error else f", {status}"
        tail += _dumps(said)[1:-1]
    return doc_id, template % (
        id_bytes,
        iso_json(decision.at),
        iso_json(now),
        id_bytes,
        b',"reason":' + reason_json if reason else b"",
        b""
        if outcome is None or not math.isfinite(outcome.duration_s)
        else b',"duration":' + _dumps(int(round(outcome.duration_s * 1e9))),
        _dumps(target or decision.target.key)[1:-1],
        tail,
        labels_json,
        b',"error":{"message":' + _dumps(outcome.error) + b"}"
        if outcome is not None and outcome.error
        else b"",
        _dumps(decision.id),
        iso_json(decision.episode_start),
        _dumps(decision.repeat),
        b',"held_repeats":' + _dumps(decision.held_repeats) if decision.held_repeats else b"",
        reason_json,
        _dumps(decision.target.key),
        labels_json,
        _dumps(value if value is not None and math.isfinite(value) else None),
        iso_json(evidence.observed_at),
        b""
        if evidence.pending_since is None
        else b',"pending_since":' + iso_json(evidence.pending_since),
        _policy_labels(decision.labels) if decision.labels else b"",
        b"" if spec is None else _spec(spec),
        b""
        if outcome is None
        else b',"outcome":{"status":'
        + _dumps(status)
        + b',"attempts":'
        + _dumps(outcome.attempts)
        + b',"changed":'
        + _dumps(_plain(outcome.changed))
        + _told(decision, outcome)
        + b"}",
    )


def _told(decision: Decision, outcome: Outcome) -> bytes:
    """``gpuops.outcome``'s ``state`` and ``effect`` (``outcome_told``) as JSON members."""
    stands, told = outcome_told(decision, outcome)
    return b',"state":' + _dumps(stands) + (b',"effect":' + _dumps(told) if told else b"")


@functools.lru_cache(maxsize=4096)
def _template(key: tuple[Any, ...]) -> bytes:
    """The bytes every decision entry with these values shares, with a ``%b`` slot for each
    value of its own (``_decision_entry`` fills them in one ``%``); built once per key. The key
    holds only what is the same for a policy's decisions of one verdict and outcome: a
    ``reason`` differs per target and cycle (a cooldown's "10s ago, 3590s left"), so it is a
    slot. A least-recently-used cache: a burst of new keys does not drop the hot ones."""
    (namespace, host_name, verdict, transition, ecs_outcome, executed) = key[:6]
    (policy, group, mode, expr, action) = key[6:]
    action_start, head, host = _constant(namespace, host_name)

    def fixed(*parts: bytes) -> bytes:
        return b"".join(parts).replace(b"%", b"%%")

    template = b"%b".join(
        [
            fixed(action_start),  # doc_id
            fixed(b'"}}\n{"@timestamp":'),  # @timestamp
            fixed(head),  # event.created
            fixed(b',"id":"'),  # doc_id
            fixed(
                b'","category":["host"],"type":',
                b'["change"],"action":' if executed else b'["info"],"action":',
                _dumps(action),
                b',"outcome":"',
                ecs_outcome.encode(),
                b'"',
            ),  # event.reason
            b"",  # duration
            fixed(b'},"message":"', _dumps(f"{policy} {transition} on ")[1:-1]),  # target
            fixed(_dumps(f": {verdict}")[1:-1]),  # reason and outcome
            fixed(b'","rule":', _rule(policy, group), b',"host":', host, b',"labels":'),  # labels
            b"",  # error
            fixed(b',"gpuops":{"decision":{"id":'),  # decision id
            fixed(b',"episode_start":'),  # episode start
            fixed(b',"repeat":'),  # repeat
            b"",  # held_repeats
            fixed(b'},"verdict":', _dumps(verdict), b',"reason":'),  # gpuops reason
            fixed(
                b',"transition":',
                _dumps(transition),
                b',"mode":',
                _dumps(mode),
                b',"target":{"key":',
            ),  # target key
            fixed(b',"labels":'),  # target labels
            fixed(b'},"evidence":{"expr":', _dumps(expr), b',"value":'),  # value
            fixed(b',"observed_at":'),  # observed_at
            b"",  # pending_since
            fixed(b"}"),  # policy labels
            b"",  # executor and action
            b"",  # outcome
            fixed(b"}}\n"),
        ]
    )
    return template


_POLICY_LABELS: dict[int, tuple[Mapping[str, Any], bytes]] = {}
_SPECS: dict[int, tuple[ActionSpec, bytes]] = {}


def _policy_labels(labels: Mapping[str, Any]) -> bytes:
    """``,"policy":{"labels":...}``: a policy's decisions share its labels mapping, encoded
    once (by identity, as ``_params``)."""
    cached = _POLICY_LABELS.get(id(labels))
    if cached is not None and cached[0] is labels:
        return cached[1]
    plain = {str(k): str(v) for k, v in labels.items()}
    return _remember(_POLICY_LABELS, labels, b',"policy":{"labels":' + _dumps(plain) + b"}")


def _spec(spec: ActionSpec) -> bytes:
    """``,"executor":...,"action":{...}`` of an action (by identity: a policy's decisions share
    one ``ActionSpec``)."""
    cached = _SPECS.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1]
    data = (
        b',"executor":'
        + _string(spec.executor)
        + b',"action":{"type":'
        + _string(spec.type)
        + b',"params":'
        + _params(spec.params)
        + b"}"
    )
    if type(spec.params) is not MappingProxyType:  # mutable params may change: not cached
        return data
    if len(_SPECS) >= 1024:
        _SPECS.clear()
    _SPECS[id(spec)] = (spec, data)
    return data
