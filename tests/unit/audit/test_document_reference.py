"""The one-pass decision document equals the reference built field by field, value for value,
for every shape of decision and outcome; and its spool line is that document's JSON."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from gpuops.audit.documents import decision_document
from gpuops.audit.lines import decision_entry, encode_line, entry
from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
)
from tests.unit.audit import reference_documents
from tests.unit.audit.factories import make_decision

NOW = 1_700_000_123.4567

BASE = make_decision()
DECISIONS: dict[str, Decision] = {
    "execute": BASE,
    "dry-run": make_decision("dry_run"),
    "suppressed with reason": make_decision("suppressed:cooldown", reason="cooldown 1h"),
    "awaiting approval": make_decision("awaiting_approval"),
    "no action, resolve": make_decision(action=None, transition=Transition.RESOLVE),
    "clear": make_decision(transition=Transition.CLEAR, action="restore_clocks"),
    "held repeats": replace(BASE, held_repeats=3, repeat=2),
    "no labels": replace(BASE, labels={}),
    "empty target labels": replace(BASE, target=replace(BASE.target, labels={})),
    "odd label values": make_decision(labels={"node": 'n "1"\\', "uuid": "GPU-ü\n"}),
    "no pending since, NaN value": replace(
        BASE, evidence=Evidence("up == 0", math.nan, None, 1_700_000_000.0)
    ),
    "infinite value": replace(BASE, evidence=Evidence("x", math.inf, 1.0, 2.0)),
    "nested params": replace(
        BASE,
        action=ActionSpec(
            "command",
            "command",
            {"argv": ("scontrol", "update"), "env": {"A": 1.5}, "bad": math.nan, "n": None},
        ),
    ),
    "fractional times": replace(BASE, at=1_700_000_000.0005, episode_start=1_699_999_999.9994),
}
OUTCOMES: dict[str, Outcome | None] = {
    "none": None,
    "success": Outcome(OutcomeStatus.SUCCESS, 1, 0.25, None, {"released": ["GPU-1"]}),
    "failure": Outcome(OutcomeStatus.FAILURE, 3, 2.0, "HTTP 503"),
    "skipped": Outcome(OutcomeStatus.SKIPPED, 0, math.inf),
    "success, nothing changed": Outcome(OutcomeStatus.SUCCESS, 1, 0.0),
    "success, no job moved": Outcome(
        OutcomeStatus.SUCCESS, 1, 0.1, None, {"node": "n1", "moved": [], "requeued": ["j-1"]}
    ),
}


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
@pytest.mark.parametrize("decision", sorted(DECISIONS))
def test_the_document_equals_mains(decision: str, outcome: str) -> None:
    d, o = DECISIONS[decision], OUTCOMES[outcome]
    ours = decision_document(d, o, "host-1", "default", NOW)
    theirs = reference_documents.decision_document(d, o, "host-1", "default", NOW)
    assert ours == theirs
    assert list(ours) == list(theirs)  # the same keys in the same order, too
    assert json.loads(encode_line(ours)) == json.loads(json.dumps(theirs, allow_nan=False))


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
@pytest.mark.parametrize("decision", sorted(DECISIONS))
def test_the_spool_entry_is_the_documents_json_byte_for_byte(decision: str, outcome: str) -> None:
    d, o = DECISIONS[decision], OUTCOMES[outcome]
    doc = decision_document(d, o, "host-1", 'n"s', NOW)
    doc_id, data = decision_entry(d, o, "host-1", 'n"s', NOW)
    assert doc_id == doc["event"]["id"]
    assert data == entry(doc)[1]
    action, line = data.split(b"\n", 1)
    assert json.loads(action) == {"create": {"_index": 'logs-gpuops.decision-n"s', "_id": doc_id}}
    assert line == encode_line(doc)


def test_percent_signs_in_shared_and_own_values_stay_as_they_are() -> None:
    """The entry's shared bytes are a %-template: a % in a policy name, a reason, a query, a
    host name or a label is text, never a format."""
    decision = replace(
        make_decision(reason="100%s %b %%", policy="p%d", labels={"a": "%s"}),
        evidence=Evidence("rate(x[5m]) > 50%", 0.5, 1.0, 2.0),
    )
    built = decision_entry(decision, None, "h%s", "ns%", 3.0)
    assert built == entry(decision_document(decision, None, "h%s", "ns%", 3.0))
    assert b'"reason":"100%s %b %%"' in built[1]


def test_a_reason_per_target_is_a_value_not_a_new_template() -> None:
    """A cooldown's reason differs per target and cycle: the decisions of one policy and verdict
    share one template whatever their reasons (with the reason in the template key, each
    suppressed decision would build one and the cache would drop the hot ones)."""
    from gpuops.audit import lines

    lines._template.cache_clear()
    for i in range(50):
        decision = make_decision(
            "suppressed:cooldown", reason=f"cooldown 3600s: last action {i}s ago, {3600 - i}s left"
        )
        built = decision_entry(decision, None, "h", "default", NOW)
        assert built == entry(decision_document(decision, None, "h", "default", NOW))
    assert lines._template.cache_info().currsize == 1
    assert lines._template.cache_info().misses == 1


class Tag(str):
    """A str subclass: its text is the value, but the document path stores ``str(value)``."""


class Named(str, enum.Enum):  # noqa: UP042 (a StrEnum str()s to its value)
    """A str enum: ``str()`` of a member is ``Named.A`` on Python 3.11, not its value."""

    A = "a"


@pytest.mark.parametrize(
    "labels",
    [
        {"node": "n1", "gpu": 3},
        {"node": Tag("n1")},
        {"node": Named.A, "uuid": "GPU-1"},
        {Tag("node"): "n1"},
        {"z": "1", "a": "2", "m%s": "%d"},
        {"only": "one"},
    ],
    ids=["int value", "str subclass value", "str enum value", "str subclass key", "order", "one"],
)
def test_labels_that_are_not_plain_strings_are_written_as_the_document_has_them(
    labels: dict[Any, Any],
) -> None:
    """The entry formats a target's labels once per tuple of names; a key or value that is not
    exactly ``str`` goes the document's way (``str()`` of each), so nothing differs."""
    decision = replace(BASE, target=Target(BASE.target.key, MappingProxyType(labels)))
    for outcome in (None, OUTCOMES["failure"]):
        built = decision_entry(decision, outcome, "host-1", "default", NOW)
        assert built == entry(decision_document(decision, outcome, "host-1", "default", NOW))
