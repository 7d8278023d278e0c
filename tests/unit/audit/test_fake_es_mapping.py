"""The fake Elasticsearch's memoized mapping checks (``Checker``) give the answer of the field-by
-field walk (``walk``) for every document: the same refusals, the same first problem, whether
an object's shape was seen before or not."""

from __future__ import annotations

import copy
import json
import random
import time
from typing import Any

import orjson
import pytest

from gpuops.audit.lines import decision_entry
from gpuops.audit.settings import default_templates_dir
from gpuops.model.decisions import Outcome, OutcomeStatus
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.fakes.fake_es_mapping import Checker, _NodePlans, walk
from tests.fakes.fake_es_search import Mapping_
from tests.unit.audit.factories import make_decision

VALUES: list[Any] = [
    7,
    -1.5,
    True,
    None,
    "text",
    "12",
    "2024-01-01T00:00:00Z",
    "2024-13-45",
    "10.0.0.1",
    "logs",
    {"x": 1},
    {"deep": {"when": "2024-13-45", "n": "x"}},
    [1, "a"],
    ["2024-01-01", 3],
    [],
]


def shipped_mapping() -> Mapping_:
    fake = FakeElasticsearch()
    root = default_templates_dir()
    for kind, store in (
        ("component_templates", fake.component_templates),
        ("index_templates", fake.index_templates),
    ):
        for path in sorted((root / kind).glob("*.json")):
            store[path.stem] = json.loads(path.read_text())
    return fake.stream("logs-gpuops.decision-default").mapping


MAPPINGS = {
    "shipped": shipped_mapping,
    "strict": lambda: Mapping_(
        {
            "dynamic": "strict",
            "properties": {
                "@timestamp": {"type": "date"},
                "n": {"type": "long"},
                "ok": {"type": "boolean"},
                "ip": {"type": "ip"},
                "c": {"type": "constant_keyword", "value": "logs"},
                "obj": {"properties": {"k": {"type": "keyword"}, "d": {"type": "double"}}},
                "flat": {"type": "flattened"},
            },
        }
    ),
    "dynamic": lambda: Mapping_({}),  # no template: date detection, numbers by value
}


def base_documents() -> list[dict[str, Any]]:
    now = time.time()
    decisions = [
        make_decision(),
        make_decision(verdict="suppressed:cooldown", reason="cooldown", labels={"node": "a"}),
        make_decision(action=None, labels={"pool": "p", "uuid": "GPU-2", "node": "b"}),
    ]
    outcome = Outcome(OutcomeStatus.FAILURE, 2, 0.25, error="boom", changed={"state": "drained"})
    docs = [
        orjson.loads(decision_entry(d, o, "host", "default", now)[1].split(b"\n")[1])
        for d in decisions
        for o in (None, outcome)
    ]
    docs.append(
        {"@timestamp": "2024-01-01T00:00:00Z", "n": 1, "ok": False, "ip": "::1", "c": "logs"}
    )
    docs.append({"@timestamp": 0, "obj": {"k": "v", "d": 1}, "flat": {"a": {"b": [1, "x"]}}})
    return docs


def objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found = [doc]
    for value in doc.values():
        if isinstance(value, dict):
            found += objects(value)
    return found


def mutated(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``doc`` with 1-3 changes: a value of another type, a new (maybe dotted) key, a key
    removed."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        node = rng.choice(objects(doc))
        change = rng.random()
        if change < 0.6 and node:
            node[rng.choice(list(node))] = copy.deepcopy(rng.choice(VALUES))
        elif change < 0.85:
            key = rng.choice(["new", "event.created", "n", "ok", "x.y", "labels", "ip"])
            node[key] = copy.deepcopy(rng.choice(VALUES))
        elif node:
            del node[rng.choice(list(node))]
    return doc


@pytest.mark.parametrize("name", sorted(MAPPINGS))
def test_the_memoized_checks_agree_with_the_field_by_field_walk(name: str) -> None:
    mapping = MAPPINGS[name]()
    checker = Checker(mapping)
    rng = random.Random(15)
    bases = base_documents()
    docs = [mutated(rng.choice(bases), rng) for _ in range(300)] + bases
    refused = 0
    for rounds in range(2):  # a shape first seen, then one already planned
        for doc in docs:
            expected = walk(doc, mapping)
            assert checker.check(doc) == expected, (name, rounds, doc)
            refused += expected is not None
    assert refused > len(docs) // 10  # the mutations do reach fields that can fail


def test_decision_documents_are_accepted_and_wrong_values_refused_per_field() -> None:
    checker = Checker(shipped_mapping())
    (doc, *_) = base_documents()
    assert checker.check(doc) is None
    for path, value, problem in [
        (("event", "created"), "yesterday", "failed to parse field [event.created] of type [date]"),
        (("gpuops", "decision", "repeat"), "x", "[gpuops.decision.repeat] of type [integer]"),
        (("data_stream", "dataset"), "other", "can only have a single value [gpuops.decision]"),
        (("gpuops", "evidence", "value"), "high", "[gpuops.evidence.value] of type [double]"),
    ]:
        bad = copy.deepcopy(doc)
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert problem in (checker.check(bad) or ""), path
        assert checker.check(doc) is None  # the good shape still passes after the bad one


def test_a_new_field_under_a_strict_mapping_is_refused_in_every_shape() -> None:
    checker = Checker(MAPPINGS["strict"]())
    assert checker.check({"n": 1, "obj": {"k": "v"}}) is None
    message = "mapping set to strict, dynamic introduction of [extra] within [obj] is not allowed"
    assert message in (checker.check({"n": 1, "obj": {"k": "v", "extra": 1}}) or "")
    top = checker.check({"n": 2, "new": "x"}) or ""
    assert "dynamic introduction of [new] within [_doc] is not allowed" in top
    assert checker.check({"n": 3, "obj": {"k": "w"}}) is None


@pytest.mark.parametrize("name", sorted(MAPPINGS))
def test_a_compiled_shape_passes_only_what_the_walk_passes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shapes of the base documents are compiled first, then every mutation of them is
    checked against the walk: a compiled shape that took too much (a type it does not fix, a
    value it does not test) would pass a document the walk refuses."""
    mapping = MAPPINGS[name]()
    checker = Checker(mapping)
    bases = base_documents()
    for doc in bases:
        assert checker.check(doc) == walk(doc, mapping)
    planned: list[str] = []  # objects checked through the plans ("": a whole document)
    real = _NodePlans.check
    monkeypatch.setattr(
        _NodePlans, "check", lambda self, node: planned.append(self.prefix) or real(self, node)
    )
    for doc in bases:
        assert checker.check(copy.deepcopy(doc)) == walk(doc, mapping)
    if name == "shipped":  # every decision and outcome document: by its compiled shape
        assert planned == []
    # (a shape with a field that has no cheap test, such as an ip or, without templates, a
    # date-like string, is not compiled: it goes through the plans every time)
    rng = random.Random(7)
    refused = 0
    for _ in range(300):
        doc = mutated(rng.choice(bases), rng)
        expected = walk(doc, mapping)
        assert checker.check(doc) == expected, (name, doc)
        refused += expected is not None
    assert refused > 20
