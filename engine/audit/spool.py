"""The local audit spool: fsync'd, append-only JSON-lines segments in one directory.

``AuditLog`` appends every document here before anything else; the shipper reads sealed
segments and removes one only when Elasticsearch acknowledged all its documents; ``gpuops audit
search`` reads all segments when no Elasticsearch is configured. One process writes a spool at a
time (an ``flock`` on ``.lock``). A restart never appends to an old segment, so a torn last line
of a killed process (never acknowledged) is skipped by readers and nothing else is affected.

When full (``max_spool_bytes``) the spool follows ``full_policy`` (see ``AuditSettings``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from engine.audit.errors import SpoolLockedError
from engine.audit.metrics import AuditMetrics
from engine.audit.settings import FullPolicy

log = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^segment-(\d{12})\.jsonl$")


@dataclass
class Segment:
    """One segment file: its sequence number, documents and size so far."""

    path: Path
    seq: int
    documents: int
    size: int
    opened_at: float = 0.0


def segment_paths(directory: Path) -> list[Path]:
    """The segment files of a spool directory, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _SEGMENT.match(p.name))]
    return [p for _, p in sorted(found)]


def read_segment(path: Path) -> Iterator[dict[str, Any]]:
    """The documents of one segment; a torn or invalid line (a crash mid-write) is skipped."""
    try:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):
                    log.warning("%s: skipping torn last line %d (never acknowledged)", path, number)
                    return
                try:
                    doc = json.loads(raw)
                except ValueError:
                    log.warning("%s: skipping invalid line %d", path, number)
                    continue
                if isinstance(doc, dict):
                    yield doc
    except FileNotFoundError:
        return


def read_spool(directory: Path) -> Iterator[dict[str, Any]]:
    """Every document of a spool directory, oldest segment first (no lock: read-only)."""
    for path in segment_paths(directory):
        yield from read_segment(path)


class Spool:
    """The writer side of a spool directory (thread-safe)."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_max_bytes: int,
        segment_max_age_s: float,
        max_bytes: int,
        full_policy: FullPolicy,
        fsync: bool,
        metrics: AuditMetrics,
    ) -> None:
        self.directory = directory
        self._segment_max_bytes = segment_max_bytes
        self._segment_max_age_s = segment_max_age_s
        self._max_bytes = max_bytes
        self._full_policy = full_policy
        self._fsync = fsync
        self._metrics = metrics
        self._lock = threading.Lock()
        self._sealed: list[Segment] = []
        self._active: Segment | None = None
        self._fh: IO[bytes] | None = None
        self._closed = False
        self._lock_fh: IO[bytes] | None = None
        self._next_seq = 1

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory, take the writer lock and index the segments already there."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lock_fh = (self.directory / ".lock").open("ab")
        try:
            fcntl.flock(lock_fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock_fh.close()
            raise SpoolLockedError(f"{self.directory} is in use by another gpuops process") from exc
        self._lock_fh = lock_fh
        for path in segment_paths(self.directory):
            seq = int(path.name[8:20])
            docs = sum(1 for _ in read_segment(path))
            if docs == 0:
                path.unlink(missing_ok=True)
                continue
            self._sealed.append(Segment(path, seq, docs, path.stat().st_size))
            self._next_seq = seq + 1
        self._metrics.spool_limit_bytes.set(self._max_bytes)
        self._update_gauges()
        if self._sealed:
            log.info(
                "audit spool %s: %d documents in %d segments left from a previous run",
                self.directory,
                self.documents,
                len(self._sealed),
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_active()
            if self._lock_fh is not None:
                self._lock_fh.close()
                self._lock_fh = None

    # -- writing ---------------------------------------------------------------------------

    def append(self, doc: Mapping[str, Any]) -> bool:
        """Append one document, fsync'd. False when the spool was full and dropped it."""
        return self.append_many((doc,))

    def append_many(self, docs: Sequence[Mapping[str, Any]]) -> bool:
        """Append documents with one write and one fsync (all or none). False when the spool
        was full and dropped them; ``OSError`` (disk full, unwritable) when the write failed,
        in which case nothing of it stays in the segment."""
        if not docs:
            return True
        data = b"".join(
            (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
            for doc in docs
        )
        with self._lock:
            if not self._make_room(len(data)):
                return False
            if self._active is not None and self._active.size >= self._segment_max_bytes:
                self._close_active()
            if self._active is None:
                self._open_active()
            assert self._fh is not None and self._active is not None
            try:
                view = memoryview(data)
                while view:
                    written = self._fh.write(view)
                    view = view[written or 0 :]
                if self._fsync:
                    os.fsync(self._fh.fileno())
            except OSError:
                self._undo_write()
                raise
            self._active.documents += len(docs)
            self._active.size += len(data)
            if self._closed:  # a late document after close: kept, but no handle left open
                self._close_active()
            self._metrics.spooled.inc(len(docs))
            self._update_gauges()
            return True

    def _undo_write(self) -> None:
        """Cut a failed write off the active segment, so no torn line stays before the next
        one; a segment that cannot be cut is closed (readers skip its torn last line)."""
        assert self._fh is not None and self._active is not None
        try:
            os.ftruncate(self._fh.fileno(), self._active.size)
        except OSError:
            log.warning("audit spool: could not cut a failed write off %s", self._active.path)
            self._close_active()

    def seal(self, only_if_older_than_s: float | None = None) -> bool:
        """Close the active segment so it can be shipped; True when one was sealed.

        With ``only_if_older_than_s``, seal only when its first document is that old (or the
        segment reached its size limit).
        """
        with self._lock:
            active = self._active
            if active is None or active.documents == 0:
                return False
            if only_if_older_than_s is not None:
                young = time.monotonic() - active.opened_at < only_if_older_than_s
                if young and active.size < self._segment_max_bytes:
                    return False
            self._close_active()
            return True

    def sealed(self) -> list[Segment]:
        """The sealed segments, oldest first (a snapshot)."""
        with self._lock:
            return list(self._sealed)

    def remove(self, segment: Segment) -> None:
        """Delete a segment whose documents are all acknowledged (or dead-lettered)."""
        with self._lock:
            if segment in self._sealed:
                self._sealed.remove(segment)
            segment.path.unlink(missing_ok=True)
            self._update_gauges()

    @property
    def documents(self) -> int:
        active = self._active.documents if self._active else 0
        return active + sum(s.documents for s in self._sealed)

    @property
    def size(self) -> int:
        active = self._active.size if self._active else 0
        return active + sum(s.size for s in self._sealed)

    # -- internals (hold self._lock) ---------------------------------------------------------

    def _open_active(self) -> None:
        path = self.directory / f"segment-{self._next_seq:012d}.jsonl"
        self._fh = path.open("ab", buffering=0)  # no buffer to replay a failed write
        self._active = Segment(path, self._next_seq, 0, 0, time.monotonic())
        self._next_seq += 1
        if self._fsync:  # the new directory entry must survive a crash too
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _close_active(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._active is not None:
            if self._active.documents:
                self._sealed.append(self._active)
            else:
                self._active.path.unlink(missing_ok=True)
            self._active = None

    def _make_room(self, needed: int) -> bool:
        if self.size + needed <= self._max_bytes:
            return True
        if self._full_policy == "reject_new":
            self._metrics.dropped.labels(policy="reject_new").inc()
            log.error(
                "audit spool %s full (%d bytes): dropped a new document (full_policy reject_new)",
                self.directory,
                self._max_bytes,
            )
            return False
        if self._active is not None and not self._sealed:
            self._close_active()
        while self._sealed and self.size + needed > self._max_bytes:
            oldest = self._sealed.pop(0)
            oldest.path.unlink(missing_ok=True)
            self._metrics.dropped.labels(policy="drop_oldest").inc(oldest.documents)
            log.error(
                "audit spool %s full (%d bytes): deleted oldest segment %s with %d documents "
                "(full_policy drop_oldest)",
                self.directory,
                self._max_bytes,
                oldest.path.name,
                oldest.documents,
            )
        self._update_gauges()
        return self.size + needed <= self._max_bytes or not self._sealed

    def _update_gauges(self) -> None:
        self._metrics.spool_documents.set(self.documents)
        self._metrics.spool_bytes.set(self.size)
