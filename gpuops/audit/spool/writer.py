"""The writer of a spool directory: fsync'd, append-only segments (``Spool``).

``AuditLog`` appends every document here before anything else; the shipper
(``gpuops.audit.shipping``) takes the sealed segments (``sealed``) and removes one
(``remove``) only when Elasticsearch acknowledged all its documents. One process writes a
spool at a time (an ``flock`` on ``.lock``). A restart never appends to an old segment, so a
torn last line of a killed process (never acknowledged) is skipped by readers
(``gpuops.audit.spool.segments``) and nothing else is affected.

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
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from itertools import accumulate, islice
from pathlib import Path
from typing import IO, Any

from gpuops.audit.errors import SpoolLockedError
from gpuops.audit.lines import entry
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.settings import FullPolicy
from gpuops.audit.spool.reader import count_documents
from gpuops.audit.spool.segments import Segment, segment_path, segment_paths, segment_seq

log = logging.getLogger(__name__)


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
            seq = segment_seq(path)
            docs = count_documents(path)
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
        path = segment_path(self.directory, self._next_seq)
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
