"""The background shipper: sealed spool segments → Elasticsearch bulk API → segment removed.

Started and stopped by ``AuditLog``; the shipper thread alone decides what is sent. Each
sealed segment becomes a ``Shipment`` (``gpuops.audit.shipping.shipments``: its spooled bytes
as they are), queued as runs of its documents; up to ``bulk_in_flight`` bulk requests
(``gpuops.audit.shipping.bulk``) run at once on a small pool. The batch size adapts between
``bulk_min_documents`` and ``bulk_max_documents``: it grows while requests come back fast and
clean and halves on a 429 or a slow answer (Elastic's advice: find the size where throughput
stops improving, back off on rejections). Item-level and request-level 429/502/503/504,
timeouts and refused connections are retried with exponential backoff (doubling from
``backoff_initial_s`` to ``backoff_max_s``, with jitter); any other item error sends the
document to the dead-letter file with the reason. A segment is deleted only when every one of
its documents is acknowledged or dead-lettered, and segments are deleted in spool order, so
what a crash leaves is always a suffix of the spool (shipped again after a restart: 409s,
never a duplicate). Decisions never wait for any of this.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from elasticsearch import Elasticsearch

from gpuops.audit.client import RETRYABLE_STATUSES
from gpuops.audit.errors import ElasticsearchError, RetryableError, TemplateError
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.settings import AuditSettings
from gpuops.audit.shipping.bulk import BulkResult, send
from gpuops.audit.shipping.deadletter import DeadLetters
from gpuops.audit.shipping.shipments import Run, Shipment, count, load, size
from gpuops.audit.spool import Spool
from gpuops.audit.templates import install_templates

log = logging.getLogger(__name__)


class _GiveUp(Exception):
    """Stop shipping now (closing and out of time); what is left stays in the spool."""


class Shipper:
    """Ships the spool of one ``AuditLog`` from a daemon thread."""

    def __init__(
        self,
        spool: Spool,
        settings: AuditSettings,
        metrics: AuditMetrics,
        client_factory: Callable[[], Elasticsearch],
    ) -> None:
        self._spool = spool
        self._settings = settings
        self._metrics = metrics
        self._client_factory = client_factory
        self._client: Elasticsearch | None = None
        self._bulk: tuple[Elasticsearch, Elasticsearch] | None = None  # (client, its options)
        self._client_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._closing_pause = threading.Event()
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._templates_done = not settings.install_templates
        self._failures = 0
        self._not_before = 0.0  # no request before this monotonic time (backoff)
        self._batch_docs = max(settings.bulk_min_documents, settings.bulk_max_documents // 4)
        self._split: int | None = None  # a batch refused as too large: at most this many
        self._queue: deque[Run] = deque()
        self._works: deque[Shipment] = deque()  # segments taken, in spool order
        self._in_flight: dict[Future[BulkResult], list[Run]] = {}
        self._dead_letters = DeadLetters(settings.dead_letter_dir, metrics)

    def start(self) -> None:
        """Start the shipper thread; a second start while it runs does nothing (two loops on
        one spool would race: one could remove a segment the other has only just taken)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="gpuops-audit-shipper", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for work now (a sealed segment is waiting)."""
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """Ship what is left for at most ``timeout_s``, then stop the thread."""
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s + self._settings.request_timeout_s + 1.0)
            if self._thread.is_alive():
                log.warning("audit shipper did not stop in time; the spool keeps what is left")
            self._thread = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        pool = ThreadPoolExecutor(
            max_workers=max(1, self._settings.bulk_in_flight), thread_name_prefix="gpuops-bulk"
        )
        try:
            while True:
                closing = self._closing.is_set()
                if not self._templates_done:
                    self._install_templates()
                self._spool.seal(None if closing else self._settings.segment_max_age_s)
                self._take_sealed()
                self._dispatch(pool)
                if closing and not self._in_flight and not self._queue:
                    if not self._spool.sealed():
                        return
                    continue
                self._settle(self._wait())
        except _GiveUp:
            left = self._spool.documents
            if left:
                log.warning("audit shipper stopped with %d documents left in the spool", left)
        except Exception:  # a bug must not kill auditing silently: log it loudly
            log.exception("audit shipper crashed; documents stay in the spool until restart")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _take_sealed(self) -> None:
        """Queue the documents of every sealed segment not taken yet."""
        taken = {id(w.segment) for w in self._works}
        for segment in self._spool.sealed():
            if id(segment) in taken:
                continue
            work = Shipment(segment)
            self._works.append(work)
            work.outstanding = load(work)
            if work.outstanding:
                self._queue.append((work, 0, work.outstanding))
        self._remove_done()

    def _dispatch(self, pool: ThreadPoolExecutor) -> None:
        """Send batches while a slot is free and no backoff holds them back."""
        while (
            self._queue
            and len(self._in_flight) < max(1, self._settings.bulk_in_flight)
            and time.monotonic() >= self._not_before
        ):
            batch = self._next_batch()
            self._in_flight[pool.submit(self._send, batch)] = batch

    def _next_batch(self) -> list[Run]:
        """The next documents of the queue: at most the batch size, and as many as fit in
        ``bulk_max_bytes`` (at least one), as runs of the segments' documents."""
        queue = self._queue
        docs = self._split or self._batch_docs
        room = self._settings.bulk_max_bytes
        batch: list[Run] = []
        while queue and docs > 0:
            work, lo, hi = queue[0]
            starts = work.starts
            # the most documents from lo on whose bytes fit in the room left
            end = bisect_right(starts, starts[lo] + room, lo, min(hi, lo + docs) + 1) - 1
            if end <= lo:
                if batch:
                    break
                end = lo + 1  # a document larger than bulk_max_bytes goes alone
            batch.append((work, lo, end))
            room -= starts[end] - starts[lo]
            docs -= end - lo
            if end < hi:
                queue[0] = (work, end, hi)
                break
            queue.popleft()
        return batch

    def _wait(self) -> set[Future[BulkResult]]:
        """Wait for a finished request, new work, the end of a backoff or closing."""
        now = time.monotonic()
        if self._closing.is_set() and now > self._deadline:
            raise _GiveUp
        if self._queue and now < self._not_before:
            if self._closing.is_set() and self._not_before > self._deadline:
                raise _GiveUp
            timeout = self._not_before - now
        elif self._queue and len(self._in_flight) < max(1, self._settings.bulk_in_flight):
            timeout = 0.0
        else:
            timeout = self._settings.poll_interval_s
        if self._in_flight:
            done, _ = wait(list(self._in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
            return done
        if timeout > 0 and not self._closing.is_set():
            if self._wake.wait(timeout):
                self._wake.clear()
        elif timeout > 0:
            self._closing_pause.wait(min(timeout, 0.05))
        return set()

    def _settle(self, done: Iterable[Future[BulkResult]]) -> None:
        """Account for finished requests: settled documents, retries, backoff, batch size."""
        requeue: list[Run] = []
        for future in done:
            batch = self._in_flight.pop(future)
            result = future.result()
            if result.error is not None:
                requeue += self._failed(result)
                continue
            requeue += result.retry
            settled = size(batch) - size(result.retry)
            count(batch, -1)
            count(result.retry, +1)
            self._split = None
            self._adapt(result)
            if result.retry:
                retried = size(result.retry)
                self._backoff(f"{retried} documents refused with a retryable status")
            elif settled:
                self._failures = 0
        if requeue:  # retried documents go out first, in the order they were batched
            self._queue.extendleft(reversed(requeue))
        self._remove_done()

    def _failed(self, result: BulkResult) -> list[Run]:
        """A bulk request failed as a whole: what to send again."""
        exc = result.error
        assert exc is not None
        batch = result.batch
        documents = size(batch)
        if isinstance(exc, RetryableError):
            self._metrics.bulk_requests.labels(result="retry").inc()
            self._metrics.retried.labels(reason=_reason(exc)).inc(documents)
            if exc.status == 429:
                self._shrink()
            self._backoff(f"bulk request failed: {exc}")
            return batch
        # Never stop shipping: the documents stay in the spool until Elasticsearch takes
        # them. A request refused as a whole for its content (400, 413) is split until the
        # one document it cannot take goes to the dead-letter file; anything else (401, 403,
        # 500, ...) is retried with backoff until someone fixes it.
        self._metrics.bulk_requests.labels(result="error").inc()
        if exc.status in (400, 413):
            if documents > 1:
                self._split = max(1, documents // 2)
                return batch
            work, lo, _ = batch[0]
            try:
                self._dead_letters.write([((work, lo), {"status": exc.status, "error": str(exc)})])
            except OSError:  # kept in the spool: sent (and refused) again after a backoff
                log.exception("audit: the dead-letter file is not writable")
                self._backoff(f"bulk request refused: {exc}")
                return batch
            work.outstanding -= 1
            self._split = None
            return []
        self._metrics.retried.labels(reason=f"http_{exc.status or 'error'}").inc(documents)
        self._backoff(f"bulk request refused: {exc}")
        return batch

    def _adapt(self, result: BulkResult) -> None:
        """Grow the batch while answers are fast and clean; halve it on 429s or slowness."""
        settings = self._settings
        if result.throttled or result.seconds > settings.bulk_target_s:
            self._shrink()
        elif size(result.batch) >= self._batch_docs:
            self._batch_docs = min(settings.bulk_max_documents, int(self._batch_docs * 1.25) + 1)

    def _shrink(self) -> None:
        self._batch_docs = max(self._settings.bulk_min_documents, self._batch_docs // 2)

    def _remove_done(self) -> None:
        """Delete the settled segments at the head of the spool, in order."""
        while self._works and self._works[0].outstanding <= 0:  # none queued or in flight
            work = self._works.popleft()
            self._spool.remove(work.segment)
            self._metrics.last_shipped.set_to_current_time()

    def _send(self, batch: Sequence[Run]) -> BulkResult:
        """One bulk request (on a pool thread; never raises)."""
        return send(self._bulk_client, batch, self._metrics, self._dead_letters)

    # -- helpers ----------------------------------------------------------------------------

    def _install_templates(self) -> None:
        while True:
            try:
                install_templates(self._get_client(), self._settings.templates_dir)
                self._metrics.template_installs.labels(result="ok").inc()
                break
            except TemplateError as exc:
                self._metrics.template_installs.labels(result="error").inc()
                log.error("%s; shipping without installing templates", exc)
                break
            except RetryableError as exc:
                self._metrics.template_installs.labels(result="error").inc()
                self._backoff(f"installing templates failed: {exc}")
                self._pause_until_allowed()
            except ElasticsearchError as exc:
                self._metrics.template_installs.labels(result="error").inc()
                log.error("%s; shipping without installing templates", exc)
                break
        self._templates_done = True

    def _get_client(self) -> Elasticsearch:
        with self._client_lock:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def _bulk_client(self) -> Elasticsearch:
        """The client with the request timeout of bulk requests: made once (``options()``
        builds a client and its OpenTelemetry wrappers, ~1 ms each time), except while closing,
        when the timeout shrinks to the time left."""
        if self._closing.is_set():
            return self._get_client().options(request_timeout=self._request_timeout())
        client = self._get_client()
        with self._client_lock:
            if self._bulk is None or self._bulk[0] is not client:
                self._bulk = (client, client.options(request_timeout=self._request_timeout()))
            return self._bulk[1]

    def _request_timeout(self) -> float:
        timeout = self._settings.request_timeout_s
        if self._closing.is_set():
            timeout = min(timeout, max(0.1, self._deadline - time.monotonic()))
        return timeout

    def _backoff(self, why: str) -> None:
        """Hold new requests back (doubling, with jitter); ``_GiveUp`` when closing and the
        wait would pass the deadline."""
        self._failures += 1
        base = self._settings.backoff_initial_s * 2 ** min(self._failures - 1, 30)
        delay = min(self._settings.backoff_max_s, base) * random.uniform(0.5, 1.0)
        if self._closing.is_set():
            if time.monotonic() + delay > self._deadline:
                raise _GiveUp
        else:
            log.warning("%s; retrying in %.1fs", why, delay)
        self._not_before = max(self._not_before, time.monotonic() + delay)

    def _pause_until_allowed(self) -> None:
        """Wait out the backoff outside the request loop (template installation)."""
        while (left := self._not_before - time.monotonic()) > 0:
            if self._closing.is_set():
                self._closing_pause.wait(left)
            elif self._wake.wait(left):
                self._wake.clear()


def _reason(exc: Exception) -> str:
    text = str(exc)
    for status in sorted(RETRYABLE_STATUSES):
        if f"HTTP {status}" in text:
            return f"http_{status}"
    return "connection"
