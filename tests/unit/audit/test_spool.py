"""The spool: fsync'd segments, restart, torn lines, and the bounded policy when full."""

from __future__ import annotations

import json
from pathlib import Path

from gpuops.audit.documents import decision_document
from gpuops.audit.lines import encode_line
from gpuops.audit.lines import entry as entry_of
from gpuops.audit.settings import AuditSettings
from gpuops.audit.spool import segment_paths
from gpuops.audit.spool.segments import entries, entry_lines
from tests.unit.audit.factories import doc, ids, make_decision, make_spool


def test_segments_roll_at_their_size_and_a_restart_starts_a_new_one(tmp_path: Path) -> None:
    spool, _ = make_spool(tmp_path)
    for n in range(25):
        assert spool.append(doc(n))
    spool.close()
    before = segment_paths(tmp_path)
    entry = len(entry_of(doc(0))[1])  # ~190 bytes: 5 entries fill the first 1,000
    assert len(before) == -(-25 // -(-1_000 // entry))
    assert all(p.stat().st_size >= 1_000 for p in before[:-1])
    spool, registry = make_spool(tmp_path)
    assert registry.get_sample_value("gpuops_audit_spool_documents") == 25
    spool.append(doc(25))
    spool.close()
    after = segment_paths(tmp_path)
    assert after[: len(before)] == before and len(after) == len(before) + 1
    assert ids(tmp_path) == [f"id-{n:04d}" for n in range(26)]


def test_a_torn_last_line_of_a_killed_writer_is_skipped(tmp_path: Path) -> None:
    spool, _ = make_spool(tmp_path)
    spool.append(doc(1))
    spool.close()
    with segment_paths(tmp_path)[0].open("ab") as fh:
        fh.write(b'{"event": {"id": "torn"')
    assert ids(tmp_path) == ["id-0001"]
    spool, registry = make_spool(tmp_path)
    assert registry.get_sample_value("gpuops_audit_spool_documents") == 1
    spool.close()


def test_full_spool_drops_the_oldest_segment_and_counts_it(tmp_path: Path) -> None:
    spool, registry = make_spool(tmp_path, max_bytes=3_000)
    for n in range(40):
        assert spool.append(doc(n))
    kept = ids(tmp_path)
    assert kept[-1] == "id-0039" and kept == sorted(kept)
    dropped = registry.get_sample_value(
        "gpuops_audit_dropped_documents_total", {"policy": "drop_oldest"}
    )
    assert dropped == 40 - len(kept)
    assert spool.size <= 3_000
    assert registry.get_sample_value("gpuops_audit_spool_bytes") == spool.size
    spool.close()


def test_a_full_spool_fails_closed_by_default_and_deletes_nothing(tmp_path: Path) -> None:
    spool, registry = make_spool(tmp_path, max_bytes=3_000, policy="fail_closed")
    results = [spool.append(doc(n)) for n in range(40)]
    kept = ids(tmp_path)
    assert kept == [f"id-{n:04d}" for n in range(len(kept))]  # the oldest, all of them
    assert 0 < len(kept) < 40 and results == [True] * len(kept) + [False] * (40 - len(kept))
    assert (
        registry.get_sample_value("gpuops_audit_dropped_documents_total", {"policy": "drop_oldest"})
        is None
    )
    (segment, *_) = spool.sealed()
    spool.remove(segment)  # shipped: room again
    assert spool.append(doc(99))
    assert ids(tmp_path)[-1] == "id-0099"
    spool.close()


def test_sealed_segments_are_removed_only_when_asked(tmp_path: Path) -> None:
    spool, registry = make_spool(tmp_path)
    spool.append(doc(1))
    assert spool.sealed() == []
    assert spool.seal(only_if_older_than_s=60.0) is False
    assert spool.seal() is True
    (segment,) = spool.sealed()
    spool.append(doc(2))
    spool.remove(segment)
    assert ids(tmp_path) == ["id-0002"]
    assert registry.get_sample_value("gpuops_audit_spool_documents") == 1
    spool.close()


def test_a_document_after_close_is_kept_without_leaving_a_file_open(tmp_path: Path) -> None:
    spool, _ = make_spool(tmp_path)
    spool.append(doc(0))
    spool.close()
    assert spool.append(doc(1))  # a late decision of a stopping engine
    assert spool._fh is None
    assert ids(tmp_path) == ["id-0000", "id-0001"]


def test_a_format_1_spool_of_an_older_engine_is_read_and_continued_in_format_2(
    tmp_path: Path,
) -> None:
    old = tmp_path / "segment-000000000007.jsonl"  # one document per line, no action lines
    old.write_bytes(b"".join(encode_line(doc(n)) for n in range(3)))
    spool, registry = make_spool(tmp_path)
    assert registry.get_sample_value("gpuops_audit_spool_documents") == 3
    spool.append(doc(3))
    spool.close()
    assert [p.name for p in segment_paths(tmp_path)] == [
        "segment-000000000007.jsonl",
        "segment-000000000008.ndjson",
    ]
    assert ids(tmp_path) == [f"id-{n:04d}" for n in range(4)]
    action, line = segment_paths(tmp_path)[1].read_bytes().splitlines()
    assert json.loads(action) == {
        "create": {"_index": "logs-gpuops.audit-default", "_id": "id-0003"}
    }
    assert json.loads(line) == doc(3)


def test_the_default_limit_holds_as_many_decisions_as_format_1_did(tmp_path: Path) -> None:
    """Format 2 adds each document's action line; the default limit holds as many
    documents as it would in format 1 (the downgrade recipe of elk/README.md, run with sed:
    tests/integration/audit/test_spool_downgrade.py)."""
    decision = decision_document(
        make_decision(labels={"node": "node-0001", "uuid": "GPU-0c6a3b1e-8b7f-4b43-9d1a-0123"}),
        None,
        host_name="gpuops-1",
        namespace="default",
        now=0.0,
    )
    spooled = len(entry_of(decision)[1])
    as_format_1 = len(encode_line(decision))
    limit = AuditSettings(spool_dir=tmp_path).max_spool_bytes
    assert limit // spooled >= (256 * 1024 * 1024) // as_format_1


def test_entry_lines_split_a_segment_as_entries_reads_it(tmp_path: Path) -> None:
    """The shipper's split (checked in C when well formed) agrees with ``entries`` on a good
    segment and on torn, corrupt and misplaced lines."""
    good = b"".join(
        entry_of(decision_document(make_decision(), None, "h", "default", 1.0))[1] for _ in range(3)
    )
    action, line = good.split(b"\n")[:2]
    cases = [
        good,
        b"",
        good + action + b"\n",  # an action line torn off its document
        good + action + b"\n" + line[:20],  # a torn last entry
        action + b"\n" + b"\x00\x00\n" + good,  # a block of zeros for a document
        action + b"\n" + good,  # an action line without its document
        b"garbage\n" + good,
    ]
    for data in cases:
        path = tmp_path / "segment-000000000001.ndjson"
        found = list(entries(data, path))
        assert entry_lines(data, path) == ([a for _, a, _ in found], [d for _, _, d in found])
    assert len(entry_lines(good, tmp_path / "x.ndjson")[0]) == 3
