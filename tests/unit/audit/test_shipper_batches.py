"""The shipper's batches are runs of the spooled bytes: every document of the
sealed segments goes out once, in spool order, across segments, within the batch's documents
and ``bulk_max_bytes`` (a document larger than that alone), as the bytes that were spooled."""

from __future__ import annotations

from pathlib import Path

import pytest
from elasticsearch import Elasticsearch
from prometheus_client import CollectorRegistry

from gpuops.audit.lines import entry
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.settings import AuditSettings
from gpuops.audit.shipping import Shipper
from gpuops.audit.spool import Spool, segment_paths


def doc(n: int, size: int) -> dict[str, object]:
    return {"event": {"id": f"id-{n:04d}"}, "message": "x" * size}


@pytest.mark.parametrize("known", [True, False], ids=["offsets kept", "segments read back"])
def test_batches_cover_every_document_once_in_order_within_their_limits(
    tmp_path: Path, known: bool
) -> None:
    settings = AuditSettings(
        spool_dir=tmp_path, elasticsearch_url="http://127.0.0.1:9", bulk_max_bytes=2_000
    )
    metrics = AuditMetrics(CollectorRegistry())
    spool = Spool(
        tmp_path,
        segment_max_bytes=1_500,
        segment_max_age_s=60.0,
        max_bytes=1 << 30,
        full_policy="fail_closed",
        fsync=False,
        metrics=metrics,
    )
    spool.open()
    sizes = [50 + (n * 37) % 300 for n in range(40)] + [3_000] + [60] * 9  # one too large
    entries = [entry(doc(n, size))[1] for n, size in enumerate(sizes)]
    for data in entries:
        assert spool.append_entries([data])
    spool.seal()
    assert len(segment_paths(tmp_path)) > 5

    def no_client() -> Elasticsearch:
        raise AssertionError("no request in this test")

    shipper = Shipper(spool, settings, metrics, no_client)
    shipper._take_sealed()
    spool.close()
    assert all(w.starts is w.segment.starts for w in shipper._works)  # as the spool wrote them
    if not known:  # as a restarted engine reads them: each segment split and checked
        for segment in spool.sealed():
            segment.starts = None
        shipper = Shipper(spool, settings, metrics, no_client)
        shipper._take_sealed()
    shipper._batch_docs = 7
    sent: list[bytes] = []
    spans = 0
    while shipper._queue:
        batch = shipper._next_batch()
        body = b"".join(w.data[w.starts[lo] : w.starts[hi]] for w, lo, hi in batch)
        count = sum(hi - lo for _, lo, hi in batch)
        assert 1 <= count <= 7
        assert len(body) <= 2_000 or count == 1
        spans += len({id(w) for w, _, _ in batch}) > 1
        sent += [line + b"\n" for line in body.splitlines()]
    assert spans  # batches go across segments
    assert b"".join(sent) == b"".join(entries)  # each entry once, in order, byte for byte
    assert [b"".join(w.entry(k)) for w in shipper._works for k in range(len(w.starts) - 1)] == [
        e.replace(b"\n", b"") for e in entries
    ]
