"""AuditLog against the local spool only (no Elasticsearch): the public API the runtime uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuops.audit import AuditLog, AuditSettings, SpoolLockedError
from gpuops.audit.spool import read_spool
from gpuops.model.decisions import Outcome, OutcomeStatus, SkippedEvaluation
from tests.unit.audit.factories import make_decision


def spool_lines(directory: Path) -> list[dict[str, object]]:
    return list(read_spool(directory))


def test_every_call_appends_one_ecs_line_and_returns_its_event_id(tmp_path: Path) -> None:
    audit = AuditLog(AuditSettings(spool_dir=tmp_path), host_name="engine-1")
    audit.start()
    try:
        ids = [
            audit.decision(make_decision("dry_run"), None),
            audit.decision(make_decision(), Outcome(OutcomeStatus.SUCCESS, 1, 0.25)),
            audit.skipped(SkippedEvaluation("p", "g", 1000.0, "timeout")),
            audit.operation("alice", ["admin"], "approve", "success", "10.0.0.1", "granted"),
        ]
    finally:
        audit.close()
    docs = spool_lines(tmp_path)
    assert [d["event"]["id"] for d in docs] == ids  # type: ignore[index]
    assert len(set(ids)) == 4
    assert docs[1]["event"]["duration"] == 250_000_000  # type: ignore[index]
    assert docs[1]["event"]["outcome"] == "success"  # type: ignore[index]
    assert docs[0]["event"]["outcome"] == "unknown"  # type: ignore[index]


def test_the_same_decision_and_outcome_give_the_same_event_id(tmp_path: Path) -> None:
    with AuditLog(AuditSettings(spool_dir=tmp_path), host_name="h") as audit:
        first = audit.decision(make_decision(), None)
        again = audit.decision(make_decision(), None)
        executed = audit.decision(make_decision(), Outcome(OutcomeStatus.FAILURE, error="boom"))
    assert first == again != executed


def test_a_second_writer_on_the_same_spool_is_refused(tmp_path: Path) -> None:
    with AuditLog(AuditSettings(spool_dir=tmp_path), host_name="h"):
        with pytest.raises(SpoolLockedError, match="in use by another gpuops process"):
            AuditLog(AuditSettings(spool_dir=tmp_path), host_name="h")


def test_spool_depth_is_a_metric_on_the_registry_passed_in(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    with AuditLog(AuditSettings(spool_dir=tmp_path), host_name="h", registry=registry) as audit:
        audit.decision(make_decision(), None)
        assert registry.get_sample_value("gpuops_audit_spool_documents") == 1.0
        assert registry.get_sample_value("gpuops_audit_spooled_documents_total") == 1.0
