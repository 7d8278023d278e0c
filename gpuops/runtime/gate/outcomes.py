"""Group commit of the outcomes' audit: outcomes that finish together share one spool write and
one transaction marking them audited (the spool's own group commit, one level up).

Used by ``gpuops.runtime.gate.trail.Trail``, which hands it the write of a batch; every worker
of ``gpuops.runtime.gate.gate.Gate`` whose outcome is stored waits here until it is written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from gpuops.model.decisions import Decision, Outcome

Batch = Sequence[tuple[Decision, Outcome]]


class OutcomeBatch:
    """A worker whose outcome is stored hands it here and waits until it is written; the first
    waiting worker writes every outcome handed in until then (one ``write``), the others wait
    for it. A failure of the write is raised in every worker of its batch."""

    def __init__(self, write: Callable[[Batch], None]) -> None:
        self._write = write
        self._cv = threading.Condition()
        self._pending: list[tuple[Decision, Outcome]] = []
        self._queued = 0  # outcomes handed in (tickets)
        self._done = 0  # outcomes written (or failed)
        self._writing = False
        self._failures: list[tuple[int, int, BaseException]] = []

    def write(self, decision: Decision, outcome: Outcome) -> None:
        with self._cv:
            self._pending.append((decision, outcome))
            self._queued += 1
            ticket = self._queued
            while self._done < ticket:
                if self._writing:
                    self._cv.wait()
                    continue
                self._writing = True
                batch, self._pending = self._pending, []
                low, high = self._done, self._queued
                self._cv.release()
                failure: BaseException | None = None
                try:
                    self._write(batch)
                except BaseException as exc:  # raised below in each worker of the batch
                    failure = exc
                finally:
                    self._cv.acquire()
                    self._writing = False
                    self._done = high
                    if failure is not None:
                        self._failures.append((low, high, failure))
                        del self._failures[:-64]  # older batches have no waiter left
                    self._cv.notify_all()
            for low, high, failure in self._failures:
                if low < ticket <= high:
                    raise failure
