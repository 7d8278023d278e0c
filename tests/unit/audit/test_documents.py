"""Every field of every audit document shape is an ECS 9.4 field with an allowed value, or
lives under gpuops.*."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuops.audit.documents import (
    ECS_VERSION,
    clock_step_document,
    decision_document,
    operation_document,
    skipped_document,
    stream_of,
)
from gpuops.model.decisions import Outcome, OutcomeStatus, SkippedEvaluation, Transition
from tests.unit.audit.factories import make_decision

# the fields of ECS 9.4.0 the documents use, their siblings and parents (tests/reference/README.md)
ECS = Path(__file__).resolve().parents[2] / "reference" / "ecs_flat_9.4.0.trimmed.yml"
NOW = 1_700_000_100.0


@cache
def ecs_fields() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ECS.read_text())
    return loaded


def leaves(doc: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in doc.items():
        path = prefix + key
        if isinstance(value, Mapping) and ecs_fields().get(path, {}).get("type") != "object":
            yield from leaves(value, path + ".")
        else:
            yield path, value


SHAPES: dict[str, dict[str, Any]] = {
    "decision dry-run": decision_document(make_decision("dry_run"), None, "h", "default", NOW),
    "decision suppressed": decision_document(
        make_decision("suppressed:cooldown", reason="cooldown 1h"), None, "h", "default", NOW
    ),
    "decision awaiting approval": decision_document(
        make_decision("awaiting_approval"), None, "h", "default", NOW
    ),
    "decision executed ok": decision_document(
        make_decision(),
        Outcome(OutcomeStatus.SUCCESS, 1, 0.5, None, {"released": ["GPU-1"]}),
        "h",
        "default",
        NOW,
    ),
    "decision without effect": decision_document(
        make_decision(action="migrate"),
        Outcome(
            OutcomeStatus.SUCCESS, 1, 0.5, None, {"node": "n1", "moved": [], "requeued": ["j"]}
        ),
        "h",
        "default",
        NOW,
    ),
    "decision failed": decision_document(
        make_decision(), Outcome(OutcomeStatus.FAILURE, 3, 2.0, "HTTP 503"), "h", "default", NOW
    ),
    "decision without action": decision_document(
        make_decision(action=None, transition=Transition.RESOLVE), None, "h", "default", NOW
    ),
    "alert resolved": decision_document(
        make_decision(transition=Transition.RESOLVE, action="restore_clocks"),
        Outcome(OutcomeStatus.SUCCESS, attempts=1, duration_s=0.2),
        "h",
        "default",
        NOW,
    ),
    "approval cancelled": decision_document(
        make_decision("suppressed:approval_cancelled"), None, "h", "default", NOW
    ),
    "skipped evaluation": skipped_document(
        SkippedEvaluation("p", "g", NOW, "timeout after 10s"), "h", "default", NOW
    ),
    "clock step": clock_step_document(-3600.0, NOW, "h", "default", NOW),
    "operation": operation_document(
        user="alice",
        roles=["admin"],
        action="approve",
        outcome="success",
        source_ip="10.0.0.7",
        message="alice granted approval a1",
        details={"approval": "a1", "ttl": 3600},
        error=None,
        host_name="h",
        namespace="default",
        now=NOW,
    ),
    "login failure": operation_document(
        user="anonymous",
        roles=[],
        action="login",
        outcome="failure",
        source_ip="::1",
        message="invalid bearer token",
        details=None,
        error="401 unauthorized",
        host_name="h",
        namespace="default",
        now=NOW,
    ),
    "forbidden api call": operation_document(
        user="dev",
        roles=["developer"],
        action="kill_switch",
        outcome="failure",
        source_ip="not-an-address",
        message="dev may not use the kill switch",
        details=None,
        error="403 forbidden",
        host_name="h",
        namespace="default",
        now=NOW,
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_field_is_ecs_with_an_allowed_value_or_under_gpuops(shape: str) -> None:
    doc = SHAPES[shape]
    problems = []
    for path, value in leaves(doc):
        if path.startswith("gpuops."):
            continue
        if path == "labels":  # ECS: an object of keyword values, keys without dots
            assert all(isinstance(v, str) and "." not in k for k, v in value.items())
            continue
        spec = ecs_fields().get(path)
        if spec is None:
            problems.append(f"{path} is not an ECS field")
            continue
        allowed = {a["name"] for a in spec.get("allowed_values") or []}
        values = value if isinstance(value, list) else [value]
        if "array" in (spec.get("normalize") or []):
            assert isinstance(value, list), f"{path} must be an array"
        if allowed and not set(values) <= allowed:
            problems.append(f"{path}={value} not in {sorted(allowed)}")
    assert problems == []


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_event_types_are_expected_for_the_category(shape: str) -> None:
    event = SHAPES[shape]["event"]
    expected = {
        t
        for a in ecs_fields()["event.category"]["allowed_values"]
        if a["name"] in event["category"]
        for t in a["expected_event_types"]
    }
    assert set(event["type"]) <= expected


def test_decision_fields_say_what_why_and_how_it_went() -> None:
    doc = SHAPES["decision failed"]
    assert doc["event"]["action"] == "reclaim"
    assert doc["event"]["outcome"] == "failure"
    assert doc["event"]["duration"] == 2_000_000_000
    assert doc["error"] == {"message": "HTTP 503"}
    assert doc["rule"] == {"name": "reclaim-idle-gpus", "ruleset": "gpu-efficiency"}
    assert doc["labels"] == {"node": "n1", "uuid": "GPU-1"}
    assert doc["gpuops"]["target"]["key"] == "node=n1,uuid=GPU-1"
    assert doc["gpuops"]["outcome"] == {
        "status": "failure",
        "attempts": 3,
        "changed": {},
        "state": "failed",
    }  # what failed is in error.message, not an effect
    assert doc["message"] == (
        "reclaim-idle-gpus fire on node=n1, uuid=GPU-1: execute, failure: HTTP 503"
    )
    assert stream_of(doc) == "logs-gpuops.decision-default"


def test_an_action_that_changed_nothing_its_verb_promises_says_so() -> None:
    """A migrate that moved no job ran (ECS: a change, ``success``) but is ``no effect``."""
    doc = SHAPES["decision without effect"]
    assert doc["event"]["outcome"] == "success" and doc["event"]["type"] == ["change"]
    assert doc["gpuops"]["outcome"]["state"] == "no effect"
    assert (
        doc["gpuops"]["outcome"]["effect"] == "n1 drained; j requeued: no free node; no job moved"
    )
    done = SHAPES["decision executed ok"]["gpuops"]["outcome"]
    assert (done["state"], done["effect"]) == ("done", "released: GPU-1")


def test_not_executed_decisions_have_unknown_outcome_and_their_reason() -> None:
    doc = SHAPES["decision suppressed"]
    assert doc["event"]["outcome"] == "unknown"
    assert doc["gpuops"]["verdict"] == "suppressed:cooldown"
    assert doc["event"]["reason"] == "cooldown 1h"
    assert SHAPES["decision without action"]["event"]["action"] == "resolve"


def test_operations_go_to_the_audit_stream_and_keep_invalid_addresses_out_of_source_ip() -> None:
    assert stream_of(SHAPES["operation"]) == "logs-gpuops.audit-default"
    assert SHAPES["operation"]["source"] == {"address": "10.0.0.7", "ip": "10.0.0.7"}
    assert SHAPES["forbidden api call"]["source"] == {"address": "not-an-address"}
    assert SHAPES["forbidden api call"]["event"]["type"] == ["change", "denied"]
    assert SHAPES["login failure"]["event"]["category"] == ["authentication"]


def test_event_id_is_deterministic_per_decision_verdict_and_outcome() -> None:
    def again(verdict: str, outcome: Outcome | None) -> str:
        doc = decision_document(make_decision(verdict), outcome, "h", "default", NOW + 5)
        return str(doc["event"]["id"])

    ok = Outcome(OutcomeStatus.SUCCESS)
    assert again("dry_run", None) == SHAPES["decision dry-run"]["event"]["id"]
    assert len({again("dry_run", None), again("execute", None), again("execute", ok)}) == 3


def test_the_reference_is_the_version_the_documents_declare() -> None:
    assert f"_{ECS_VERSION}." in ECS.name
    assert "event.category" in ecs_fields() and "gpuops.verdict" not in ecs_fields()
