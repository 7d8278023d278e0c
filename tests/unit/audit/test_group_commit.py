"""Group commit of the spool: concurrent appends share an fsync, each returns only
once its bytes are durable, and a failed fsync fails every append it covered and leaves none
of their lines behind."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable, Iterator
from itertools import accumulate
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuops.audit.lines import encode_line
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.spool import Spool, read_spool
from gpuops.audit.spool.segments import entry_lines
from tests.waiting import wait_for


def make_spool(directory: Path) -> Spool:
    spool = Spool(
        directory,
        segment_max_bytes=1 << 20,
        segment_max_age_s=60.0,
        max_bytes=1 << 30,
        full_policy="fail_closed",
        fsync=True,
        metrics=AuditMetrics(CollectorRegistry()),
    )
    spool.open()
    return spool


def doc(n: int) -> dict[str, object]:
    return {"event": {"id": f"id-{n:05d}"}, "message": "ü" * 40}


class SlowFsync:
    """Counts fsyncs; each one takes until ``release`` is set (so appends pile up behind it)."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.calls = 0
        self.release = threading.Event()
        self.fail: OSError | None = None
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls += 1
        assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        self.real(fd)


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Spool, SlowFsync]]:
    """A spool with one document (its segment open) whose next fsync waits for ``release``."""
    fsync = SlowFsync(os.fsync)
    monkeypatch.setattr("gpuops.audit.spool.writer.os.fsync", fsync)
    spool = make_spool(tmp_path)
    fsync.release.set()
    spool.append(doc(0))  # opens the segment (its directory fsync counts too)
    fsync.release.clear()
    yield spool, fsync
    fsync.release.set()
    spool.close()


def test_concurrent_appends_share_fsyncs_and_return_only_when_durable(
    tmp_path: Path, held: tuple[Spool, SlowFsync]
) -> None:
    spool, fsync = held
    before = fsync.calls
    done: list[int] = []

    def append(n: int) -> None:
        spool.append(doc(n))
        done.append(n)

    threads = [threading.Thread(target=append, args=(n,)) for n in range(1, 41)]
    for t in threads:
        t.start()
    # nothing returns while the first fsync is held; all forty wrote and wait
    wait_for(lambda: spool._written == 41, 10, "the forty writes")
    assert done == []
    fsync.release.set()
    for t in threads:
        t.join(10)
    assert sorted(done) == list(range(1, 41))
    assert fsync.calls - before <= 2  # the held one, and one covering all that waited for it
    assert sorted(d["event"]["id"] for d in read_spool(tmp_path)) == [
        f"id-{n:05d}" for n in range(41)
    ]


def test_a_failed_fsync_fails_every_append_it_covered_and_cuts_their_lines(
    tmp_path: Path, held: tuple[Spool, SlowFsync]
) -> None:
    spool, fsync = held
    fsync.fail = OSError(errno.EIO, "Input/output error")
    errors: list[int] = []

    def append(n: int) -> None:
        try:
            spool.append_many([doc(n), doc(n + 1000)])
        except OSError as exc:
            assert exc.errno == errno.EIO
            errors.append(n)

    threads = [threading.Thread(target=append, args=(n,)) for n in range(2, 12)]
    for t in threads:
        t.start()
    wait_for(lambda: spool._written == 11, 10, "the ten writes")
    fsync.release.set()
    for t in threads:
        t.join(10)
    assert sorted(errors) == list(range(2, 12))
    fsync.fail = None
    assert spool.append(doc(99))
    assert [d["event"]["id"] for d in read_spool(tmp_path)] == ["id-00000", "id-00099"]
    assert spool.documents == 2
    # the offsets the spool keeps for the shipper (Segment.starts) are the file's, cut too
    active = spool._active
    assert active is not None and active.starts is not None
    actions, lines = entry_lines(active.path.read_bytes(), active.path)
    sizes = [len(a) + len(line) + 2 for a, line in zip(actions, lines, strict=True)]
    assert list(active.starts) == list(accumulate(sizes, initial=0))


def test_encoded_lines_are_the_documents_json() -> None:
    value = {"a": {"b": [1, 2.5, None, True]}, "ü": "naïve", "big": 2**70, "t": (1, 2)}
    line = encode_line(value)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {**value, "t": [1, 2]}
    assert encode_line({"x": "é"}) == '{"x":"é"}\n'.encode()


def test_an_append_whose_segment_was_closed_before_its_fsync_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writes and has not yet waited for its fsync; B's write fails and cannot be cut off
    (ftruncate fails too), so the segment is closed without an fsync. A must not return as if
    durable (it did: no fsync covered its bytes, and the gate would have run its action)."""
    spool = make_spool(tmp_path)
    written, go = threading.Event(), threading.Event()
    wait_durable = spool._wait_durable

    def after_write(ticket: int) -> None:
        written.set()
        assert go.wait(10)
        wait_durable(ticket)

    monkeypatch.setattr(spool, "_wait_durable", after_write)
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    result: dict[str, object] = {}

    def append_a() -> None:
        try:
            result["a"] = spool.append(doc(1))
        except OSError as exc:
            result["a"] = exc

    writer = threading.Thread(target=append_a)
    writer.start()
    assert written.wait(10)
    monkeypatch.setattr(spool, "_wait_durable", wait_durable)
    fsyncs.clear()
    handle = spool._fh
    assert handle is not None

    class NoSpace:
        def write(self, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def fileno(self) -> int:
            assert handle is not None
            return handle.fileno()

        def close(self) -> None:
            assert handle is not None
            handle.close()

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(spool, "_fh", NoSpace())
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    with pytest.raises(OSError):
        spool.append(doc(2))
    go.set()
    writer.join(10)
    assert isinstance(result["a"], OSError), (result, fsyncs)
    spool.close()
