"""The local audit spool: fsync'd, append-only segments in one directory.

Format 2 (``segment-<seq>.ndjson``, written since issue 15): each document is two lines, its
bulk action line (``{"create":{"_index":<data stream>,"_id":<event.id>}}``) and its JSON
(``gpuops.audit.lines``), so a segment is a ready Elasticsearch ``_bulk`` body and the shipper
sends its bytes without parsing them. Format 1 (``segment-<seq>.jsonl``, one JSON document per
line) is still read: a spool left by an older engine is shipped and searched as before; new
documents always go to format 2 segments. Readers tell the formats by the file name. A
downgrade to an engine that knows only format 1 is not supported (it would neither ship nor
search ``.ndjson`` segments): ``elk/README.md`` says how to drain or convert the spool first.

``AuditLog`` appends every document here before anything else; the shipper reads sealed
segments and removes one only when Elasticsearch acknowledged all its documents; ``gpuops audit
search`` reads all segments when no Elasticsearch is configured. One process writes a spool at a
time (an ``flock`` on ``.lock``). A restart never appends to an old segment, so a torn last line
of a killed process (never acknowledged) is skipped by readers and nothing else is affected.

Appends are group-committed: ``append_many`` writes its documents in one ``write`` under the
lock, then waits outside it for an fsync that covers its bytes; one thread runs that fsync for
every append written before it started, so concurrent appends share it (PostgreSQL's and
SQLite-WAL's group commit). An append still returns only once its bytes are durable; a failed
fsync fails every append it covered, and their bytes are cut off the segment again.

When full (``max_spool_bytes``) the spool follows ``full_policy`` (see ``AuditSettings``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import threading
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import methodcaller
from pathlib import Path
from typing import IO, Any

import orjson

from gpuops.audit.errors import SpoolLockedError
from gpuops.audit.lines import encode_line, entry
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.settings import FullPolicy

log = logging.getLogger(__name__)

__all__ = ["Segment", "Spool", "encode_line", "read_segment", "read_spool", "segment_paths"]

_SEGMENT = re.compile(r"^segment-(\d{12})\.(jsonl|ndjson)$")
ACTION_PREFIX = b'{"create":'
"""How every action line of a format 2 segment starts (no document line does: documents
start with ``{"@timestamp"`` or another field of their own)."""


@dataclass
class Segment:
    """One segment file: its sequence number, documents and size so far."""

    path: Path
    seq: int
    documents: int
    size: int
    opened_at: float = 0.0
    starts: array[int] | None = None
    """Of a segment this process wrote (format 2): the byte offset of each entry, then the
    segment's size, kept as each append is written, so that the shipper need not split and
    check the lines it wrote itself; None when unknown (a segment a previous run left, or one
    whose failed write could not be cut off): the shipper then reads it line by line. 8 bytes
    a document (an ``array``: a 60 s outage at 20,000/s keeps ~10 MB of them)."""

    @property
    def version(self) -> int:
        """The segment's format: 2 (action and document lines), 1 (document lines)."""
        return segment_version(self.path)


def segment_version(path: Path) -> int:
    return 2 if path.suffix == ".ndjson" else 1


def entries(data: bytes, path: Path) -> Iterator[tuple[int, bytes, bytes]]:
    """The complete entries of a format 2 segment's bytes: (line number of the action line,
    action line, document line), newlines cut off. A torn last entry (a process killed while
    writing, never acknowledged) and a line out of place are skipped with a warning.

    A document line is checked only as far as it costs nothing: it must start with ``{`` and
    not be an action line (a corrupt line, e.g. a disk block of zeros, is skipped with its
    action; an action line followed by another action line lost its document and is skipped
    alone). A line that starts well but is not JSON is sent all the same: Elasticsearch refuses
    it and the shipper dead-letters its bytes."""
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the segment ends with a newline
    i, n = 0, len(lines)
    while i < n:
        action = lines[i]
        if not action.startswith(ACTION_PREFIX):
            log.warning("%s: skipping invalid line %d", path, i + 1)
            i += 1
            continue
        if i + 1 == n:
            torn = torn or action
            break
        line = lines[i + 1]
        if not line.startswith(b"{"):
            log.warning("%s: skipping invalid document line %d", path, i + 2)
            i += 2
            continue
        if line.startswith(ACTION_PREFIX):
            log.warning("%s: skipping action line %d without its document", path, i + 1)
            i += 1
            continue
        yield i + 1, action, line
        i += 2
    if torn:
        log.warning("%s: skipping torn last entry at line %d (never acknowledged)", path, i + 1)


_IS_ACTION = methodcaller("startswith", ACTION_PREFIX)
_IS_OBJECT = methodcaller("startswith", b"{")


def entry_lines(data: bytes, path: Path) -> tuple[list[bytes], list[bytes]]:
    """The action lines and the document lines of ``entries(data, path)``, as two lists. A
    well-formed segment (the common case: every other line an action line, the others
    objects, a newline at the end) is checked and split in C; any other goes through
    ``entries``, which skips and reports what is out of place."""
    lines = data.split(b"\n")
    if not lines[-1] and len(lines) % 2:
        actions, docs = lines[0:-1:2], lines[1::2]
        if (
            all(map(_IS_ACTION, actions))
            and all(map(_IS_OBJECT, docs))
            and not any(map(_IS_ACTION, docs))
        ):
            return actions, docs
    found = list(entries(data, path))
    return [action for _, action, _ in found], [doc for _, _, doc in found]


def segment_paths(directory: Path) -> list[Path]:
    """The segment files of a spool directory, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _SEGMENT.match(p.name))]
    return [p for _, p in sorted(found)]


def read_segment(path: Path) -> Iterator[dict[str, Any]]:
    """The documents of one segment; a torn or invalid line (a crash mid-write) is skipped."""
    if segment_version(path) == 2:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        for number, _, line in entries(data, path):
            try:
                doc = orjson.loads(line)
            except ValueError:  # orjson.JSONDecodeError is a ValueError
                log.warning("%s: skipping invalid line %d", path, number + 1)
                continue
            if isinstance(doc, dict):
                yield doc
        return
    try:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):
                    log.warning("%s: skipping torn last line %d (never acknowledged)", path, number)
                    return
                try:
                    doc = orjson.loads(raw)
                except ValueError:  # orjson.JSONDecodeError is a ValueError
                    log.warning("%s: skipping invalid line %d", path, number)
                    continue
                if isinstance(doc, dict):
                    yield doc
    except FileNotFoundError:
        return


def _count(path: Path) -> int:
    """The documents of a segment a previous run left (format 2: its complete entries, not
    parsed)."""
    if segment_version(path) == 2:
        return len(entry_lines(path.read_bytes(), path)[0])
    return sum(1 for _ in read_segment(path))


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
        self._written = 0  # writes done (tickets handed out)
        self._synced = 0  # writes known durable (or failed: see _sync_failures)
        self._syncing = False
        self._synced_cv = threading.Condition()
        self._sync_failures: list[tuple[int, int, OSError]] = []
        self._durable_size = 0  # of the active segment, at its last successful fsync
        self._durable_documents = 0
        self._full_logged_at = -1e9

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
            docs = _count(path)
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
        """Append one document, fsync'd. False when the spool was full and did not take it."""
        return self.append_many((doc,))

    def append_many(self, docs: Sequence[Mapping[str, Any]]) -> bool:
        """Append documents with one write, durable (fsync'd) when this returns, all or none.

        Concurrent calls share one fsync (group commit). False when the spool was full and
        did not take them (``full_policy``); ``OSError`` (disk full, unwritable) when the write
        or its fsync failed, in which case nothing of it stays in the segment."""
        if not docs:
            return True
        return self.append_entries([entry(doc)[1] for doc in docs])

    def append_entries(self, lines: Sequence[bytes]) -> bool:
        """``append_many`` for documents already encoded as spool entries (one each, from
        ``gpuops.audit.lines``: the action line and the document line)."""
        if not lines:
            return True
        data = b"".join(lines)
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
            except OSError:
                self._undo_write()
                raise
            starts = self._active.starts
            if starts is not None:  # where each entry ends: the next one's start
                ends = accumulate(map(len, lines), initial=self._active.size)
                starts.extend(islice(ends, 1, None))
            self._active.documents += len(lines)
            self._active.size += len(data)
            self._written += 1
            ticket = self._written
            if self._closed:  # a late document after close: kept, but no handle left open
                self._close_active()
        if self._fsync:
            self._wait_durable(ticket)
        with self._lock:
            self._metrics.spooled.inc(len(lines))
            self._update_gauges()
        return True

    def _wait_durable(self, ticket: int) -> None:
        """Return once write number ``ticket`` is fsync'd; run the fsync when no other thread
        does (it covers every write done before it starts). Raise the fsync's ``OSError``
        when it failed for this write."""
        with self._synced_cv:
            while True:
                for low, high, failure in self._sync_failures:
                    if low < ticket <= high:
                        raise OSError(failure.errno, failure.strerror) from failure
                if self._synced >= ticket:
                    return
                if self._syncing:
                    self._synced_cv.wait()
                    continue
                self._syncing = True
                break
        error: OSError | None = None
        with self._lock:  # what this fsync covers: every write so far, in the active file
            target = self._written
            active = self._active
            size = active.size if active is not None else 0
            documents = active.documents if active is not None else 0
            fd = os.dup(self._fh.fileno()) if self._fh is not None else None
        try:
            if fd is not None:  # None: closing the segment fsync'd it
                os.fsync(fd)
        except OSError as exc:
            error = exc
        finally:
            if fd is not None:
                os.close(fd)
        with self._lock:
            try:
                if error is not None:
                    self._fail_unsynced(error)
                elif active is not None and active is self._active:
                    self._durable_size = max(self._durable_size, size)
                    self._durable_documents = max(self._durable_documents, documents)
            finally:
                self._end_sync(target, ticket)

    def _end_sync(self, target: int, ticket: int) -> None:
        """The fsync covering writes up to ``target`` is over: wake the waiters; raise its
        error for ``ticket`` if it failed (holding ``self._lock``)."""
        with self._synced_cv:
            self._syncing = False
            self._synced = max(self._synced, target)
            self._synced_cv.notify_all()
            for low, high, failure in self._sync_failures:
                if low < ticket <= high:
                    raise OSError(failure.errno, failure.strerror) from failure

    def _undo_write(self) -> None:
        """Cut a failed write off the active segment, so no torn line stays before the next
        one; a segment that cannot be cut is closed (readers skip its torn last line)."""
        assert self._fh is not None and self._active is not None
        starts = self._active.starts
        if starts is not None:  # the entries cut off (or all: read them back if it fails)
            del starts[self._active.documents + 1 :]
            if starts[-1] != self._active.size:
                self._active.starts = None
        try:
            os.ftruncate(self._fh.fileno(), self._active.size)
        except OSError:
            log.warning("audit spool: could not cut a failed write off %s", self._active.path)
            self._active.starts = None
            self._close_active(sync=False)

    def _fail_unsynced(self, error: OSError) -> None:
        """After a failed fsync (holding ``self._lock``): cut every write not yet durable off
        the active segment and fail the appends that made them."""
        low, high = self._synced, self._written
        if self._active is not None and self._fh is not None:
            self._active.size = self._durable_size
            self._active.documents = self._durable_documents
            self._undo_write()
        self._fail_range(error, low, high)

    def _fail_range(self, error: OSError, low: int | None = None, high: int | None = None) -> None:
        """Fail the appends of writes ``low`` < n <= ``high`` (default: every write not yet
        durable) with ``error``, and wake their waiters (holding ``self._lock``)."""
        low = self._synced if low is None else low
        high = self._written if high is None else high
        with self._synced_cv:
            self._sync_failures.append((low, high, error))
            del self._sync_failures[:-1024]  # older failures have no waiter left
            self._synced = max(self._synced, high)
            self._synced_cv.notify_all()

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
        path = self.directory / f"segment-{self._next_seq:012d}.ndjson"
        self._fh = path.open("ab", buffering=0)  # no buffer to replay a failed write
        self._active = Segment(path, self._next_seq, 0, 0, time.monotonic(), array("q", [0]))
        self._durable_size = self._durable_documents = 0
        self._next_seq += 1
        if self._fsync:  # the new directory entry must survive a crash too
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _close_active(self, sync: bool = True) -> None:
        """Close (seal) the active segment; its writes are fsync'd first, so a sealed segment
        is durable as a whole (a failed fsync cuts them off and fails their appends)."""
        if self._fh is not None and self._fsync and self._synced < self._written:
            if not sync:  # closed unsynced (a write that cannot be cut off): its waiters fail
                self._fail_range(OSError(errno.EIO, "segment closed before its fsync"))
            else:
                try:
                    os.fsync(self._fh.fileno())
                except OSError as exc:
                    self._fail_unsynced(exc)
                else:
                    with self._synced_cv:
                        self._synced = self._written
                        self._synced_cv.notify_all()
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
        if self._full_policy != "drop_oldest":  # fail_closed: refuse, as a full disk would
            now = time.monotonic()
            if now - self._full_logged_at >= 10.0:  # once per 10 s, not per refused document
                self._full_logged_at = now
                log.error(
                    "audit spool %s full (%d of %d bytes, %d documents not yet shipped): new "
                    "documents are refused and no action runs until Elasticsearch takes some "
                    "(full_policy fail_closed)",
                    self.directory,
                    self.size,
                    self._max_bytes,
                    self.documents,
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
