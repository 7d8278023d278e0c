"""The shipper against the fake Elasticsearch with the real client: data streams, op_type create,
_id = event.id, 409 as stored, retries with backoff, dead letters, templates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from gpuops.audit import AuditLog, AuditSettings
from gpuops.audit.lines import action_line, entry
from gpuops.audit.spool import segment_paths
from gpuops.cli import cli
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.unit.audit.factories import make_decision, wait_until

DECISIONS = "logs-gpuops.decision-default"
AUDIT = "logs-gpuops.audit-default"


@pytest.fixture
def es() -> Iterator[FakeElasticsearch]:
    with FakeElasticsearch() as fake:
        yield fake


def settings(spool: Path, es: FakeElasticsearch) -> AuditSettings:
    return AuditSettings(
        spool_dir=spool,
        elasticsearch_url=es.url,
        segment_max_age_s=0.0,
        poll_interval_s=0.01,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        request_timeout_s=2.0,
    )


def record(audit: AuditLog, n: int, first: int = 0) -> list[str]:
    return [
        audit.decision(make_decision(labels={"node": f"n{i}", "uuid": f"GPU-{i}"}), None)
        for i in range(first, first + n)
    ]


def sample(audit: AuditLog, name: str, **labels: str) -> float:
    return audit.registry.get_sample_value(name, labels) or 0.0


def test_documents_reach_their_data_streams_and_segments_are_deleted(
    tmp_path: Path, es: FakeElasticsearch
) -> None:
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        ids = record(audit, 5)
        op = audit.operation("alice", ["admin"], "pause", "success", "127.0.0.1", "paused")
        wait_until(lambda: audit.pending == 0, what="the spool to drain")
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(ids)
    assert [d["event"]["id"] for d in es.documents(AUDIT)] == [op]
    assert es.streams[DECISIONS].data_stream
    assert segment_paths(tmp_path) == []
    assert ("PUT", "/_index_template/logs-gpuops.decision") in es.requests
    assert sample(audit, "gpuops_audit_shipped_documents_total", result="created") == 6


def test_a_document_sent_again_is_a_409_and_counts_as_stored(
    tmp_path: Path, es: FakeElasticsearch
) -> None:
    with AuditLog(settings(tmp_path / "a", es), host_name="h") as first:
        ids = record(first, 3)
        wait_until(lambda: first.pending == 0)
    with AuditLog(settings(tmp_path / "b", es), host_name="h") as again:
        assert record(again, 3) == ids
        wait_until(lambda: again.pending == 0)
    assert len(es.documents(DECISIONS)) == 3
    assert sample(again, "gpuops_audit_shipped_documents_total", result="duplicate") == 3
    assert not (tmp_path / "b" / "dead-letter").exists()


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_whole_request_errors_are_retried(
    tmp_path: Path, es: FakeElasticsearch, status: int
) -> None:
    es.fail_next(status, times=3)
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        ids = record(audit, 4)
        wait_until(lambda: audit.pending == 0)
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(ids)
    assert sample(audit, "gpuops_audit_retried_documents_total", reason=f"http_{status}") >= 4
    assert sample(audit, "gpuops_audit_bulk_requests_total", result="retry") == 3


def test_item_level_429_is_retried_alone(tmp_path: Path, es: FakeElasticsearch) -> None:
    es.fail_next(429, times=2, scope="item")
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        assert audit._shipper is not None
        running = audit._shipper._thread
        audit.start()  # a second start (``with`` started it): still the one shipper thread
        assert running is not None and audit._shipper._thread is running
        ids = record(audit, 5)
        wait_until(lambda: audit.pending == 0)
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(ids)
    assert sample(audit, "gpuops_audit_retried_documents_total", reason="item_429") == 2
    assert sample(audit, "gpuops_audit_shipped_documents_total", result="created") == 5


def test_other_item_errors_go_to_the_dead_letter_file_with_the_reason(
    tmp_path: Path, es: FakeElasticsearch
) -> None:
    # a format 1 segment whose document the template refuses (duration: long)
    bad = {
        "@timestamp": "2024-01-01T00:00:00.000Z",
        "data_stream": {"type": "logs", "dataset": "gpuops.decision", "namespace": "default"},
        "event": {"id": "old-1", "duration": "1.5s"},
    }
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "segment-000000000001.jsonl").write_text(json.dumps(bad) + "\n")
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        good = record(audit, 2)
        wait_until(lambda: audit.pending == 0)
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(good)
    lines = (tmp_path / "dead-letter" / "dead-letter.jsonl").read_text().splitlines()
    (entry,) = [json.loads(x) for x in lines]
    assert entry["status"] == 400
    assert entry["document"] == bad
    assert "event.duration" in entry["reason"]
    assert sample(audit, "gpuops_audit_dead_lettered_documents_total") == 1
    assert segment_paths(tmp_path) == []


def test_an_outage_never_blocks_decisions_and_loses_nothing(
    tmp_path: Path, es: FakeElasticsearch
) -> None:
    registry = CollectorRegistry()
    with AuditLog(settings(tmp_path, es), host_name="h", registry=registry) as audit:
        first = record(audit, 3)
        wait_until(lambda: audit.pending == 0)
        with es.outage():
            during = [
                audit.decision(make_decision(labels={"node": "o", "uuid": str(i)}), None)
                for i in range(20)
            ]
            wait_until(
                lambda: (
                    (
                        registry.get_sample_value(
                            "gpuops_audit_retried_documents_total", {"reason": "connection"}
                        )
                        or 0
                    )
                    > 0
                ),
                what="a retry during the outage",
            )
            assert registry.get_sample_value("gpuops_audit_spool_documents") == 20
        wait_until(lambda: audit.pending == 0, what="the spool to drain after the outage")
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(first + during)


def test_close_leaves_what_it_could_not_ship_for_the_next_start(
    tmp_path: Path, es: FakeElasticsearch
) -> None:
    config = replace(settings(tmp_path, es), close_timeout_s=0.2)
    with es.outage():
        with AuditLog(config, host_name="h") as audit:
            ids = record(audit, 4)
        assert audit.pending == 4
    with AuditLog(config, host_name="h") as audit:
        wait_until(lambda: audit.pending == 0)
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(ids)


def test_templates_install_idempotently_from_the_cli(es: FakeElasticsearch) -> None:
    runner = CliRunner()
    for _ in range(2):
        result = runner.invoke(cli, ["elk", "install", "--url", es.url])
        assert result.exit_code == 0, result.output
    assert "installed index/logs-gpuops.decision" in result.output
    assert set(es.component_templates) == {"gpuops-ecs", "gpuops-fields", "gpuops-settings"}
    assert es.index_templates["logs-gpuops.audit"]["priority"] > 500
    assert "gpuops-audit" in es.ilm


def test_elk_install_reports_an_unreachable_server() -> None:
    result = CliRunner().invoke(cli, ["elk", "install", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "installing ilm gpuops-audit: ConnectionError" in result.output


@pytest.mark.parametrize("status", [401, 403, 500])
def test_other_whole_request_errors_never_stop_shipping(
    tmp_path: Path, es: FakeElasticsearch, status: int
) -> None:
    es.fail_next(status, times=2)
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        first = record(audit, 3)
        wait_until(lambda: audit.pending == 0, what="the spool to drain after the errors")
        later = record(audit, 2, first=3)  # the shipper is still alive
        wait_until(lambda: audit.pending == 0, what="later documents")
        assert sample(audit, "gpuops_audit_bulk_requests_total", result="error") == 2
    stored = sorted(d["event"]["id"] for d in es.documents(DECISIONS))
    assert stored == sorted(first + later)


def test_a_request_too_large_is_split(tmp_path: Path, es: FakeElasticsearch) -> None:
    es.fail_next(413, times=1)
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        decisions = [make_decision(labels={"node": "n", "uuid": f"GPU-{i}"}) for i in range(4)]
        ids = audit.write_ahead([(d, None) for d in decisions])  # one segment, one request
        audit.close()
    assert sorted(d["event"]["id"] for d in es.documents(DECISIONS)) == sorted(ids)
    assert not (tmp_path / "dead-letter").exists()


def test_a_document_refused_alone_goes_to_the_dead_letter_file(
    tmp_path: Path, es: FakeElasticsearch
) -> None:
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        es.fail_next(400, times=1)
        (refused,) = record(audit, 1)
        wait_until(lambda: audit.pending == 0, what="the refused document to leave the spool")
        (accepted,) = record(audit, 1, first=1)
        wait_until(lambda: audit.pending == 0, what="the next document")
    assert [d["event"]["id"] for d in es.documents(DECISIONS)] == [accepted]
    dead = (tmp_path / "dead-letter" / "dead-letter.jsonl").read_text().splitlines()
    (entry,) = [json.loads(line) for line in dead]
    assert entry["status"] == 400 and entry["document"]["event"]["id"] == refused


def test_a_corrupt_line_in_a_spooled_segment_is_dead_lettered_and_shipping_goes_on(
    tmp_path: Path, es: FakeElasticsearch, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment of format 2 left with corrupt lines (a bad disk block, an edited file): a
    document line that is no JSON goes to the dead-letter file as its bytes, a line that does
    not even start like a document is skipped on read with its line number; the rest is
    shipped, the segment removed, and the shipper lives on (it crashed on every start)."""

    def doc(n: int) -> dict[str, object]:
        return {
            "@timestamp": "2024-01-01T00:00:00.000Z",
            "data_stream": {"type": "logs", "dataset": "gpuops.decision", "namespace": "default"},
            "event": {"id": f"old-{n}"},
        }

    corrupt = b'{"@timestamp":"2024-01-01T00:00:00.000Z","event":{"id":"old-2"\xff\x00'
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "segment-000000000001.ndjson").write_bytes(
        entry(doc(1))[1]
        + action_line(DECISIONS, "old-2")
        + corrupt
        + b"\n"
        + action_line(DECISIONS, "old-3")
        + b"\x00" * 16
        + b"\n"
        + action_line(DECISIONS, "old-4")  # lost its document line
        + entry(doc(5))[1]
    )
    with AuditLog(settings(tmp_path, es), host_name="h") as audit:
        wait_until(lambda: audit.pending == 0, what="the corrupt segment to leave the spool")
        later = record(audit, 1)  # the shipper is still alive
        wait_until(lambda: audit.pending == 0, what="a later document")
    stored = sorted(d["event"]["id"] for d in es.documents(DECISIONS))
    assert stored == sorted(["old-1", "old-5", *later])
    dead = (tmp_path / "dead-letter" / "dead-letter.jsonl").read_text().splitlines()
    (refused,) = [json.loads(line) for line in dead]
    assert refused["status"] == 400 and refused["index"] == DECISIONS
    assert (
        refused["document_raw"]
        == '{"@timestamp":"2024-01-01T00:00:00.000Z","event":{"id":"old-2"\\xff\x00'
    )
    assert "segment-000000000001.ndjson: skipping invalid document line 6" in caplog.text
    assert "segment-000000000001.ndjson: skipping action line 7 without its document" in (
        caplog.text
    )
    assert segment_paths(tmp_path) == []
