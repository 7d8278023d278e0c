"""The background shipper: sealed spool segments → Elasticsearch bulk API → segment removed.

Started and stopped by ``AuditLog``. Each document is sent with op_type ``create`` and
``_id = event.id`` into its data stream, so a document sent twice (a retry, a restart after a
crash) is a 409, which counts as stored. Item-level and request-level 429/502/503/504, timeouts
and refused connections are retried with exponential backoff (doubling from
``backoff_initial_s`` to ``backoff_max_s``, with jitter); any other item error sends the
document to the dead-letter file with the reason. A segment is deleted only when every one of
its documents is acknowledged or dead-lettered. Decisions never wait for any of this.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from elasticsearch import Elasticsearch

from engine.audit.client import CLIENT_ERRORS, RETRYABLE_STATUSES, wrap
from engine.audit.documents import stream_of
from engine.audit.errors import ElasticsearchError, RetryableError, TemplateError
from engine.audit.metrics import AuditMetrics
from engine.audit.settings import AuditSettings
from engine.audit.spool import Segment, Spool, read_segment
from engine.audit.templates import install_templates

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
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._closing_pause = threading.Event()
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._templates_done = not settings.install_templates
        self._failures = 0

    def start(self) -> None:
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
        try:
            while True:
                closing = self._closing.is_set()
                if not self._templates_done:
                    self._install_templates()
                self._spool.seal(None if closing else self._settings.segment_max_age_s)
                segments = self._spool.sealed()
                for segment in segments:
                    self._ship_segment(segment)
                if closing and not self._spool.sealed():
                    self._spool.seal()
                    if not self._spool.sealed():
                        return
                if not segments and not closing:
                    self._wake.wait(self._settings.poll_interval_s)
                    self._wake.clear()
        except _GiveUp:
            left = self._spool.documents
            if left:
                log.warning("audit shipper stopped with %d documents left in the spool", left)
        except Exception:  # a bug must not kill auditing silently: log it loudly
            log.exception("audit shipper crashed; documents stay in the spool until restart")

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
            except ElasticsearchError as exc:
                self._metrics.template_installs.labels(result="error").inc()
                log.error("%s; shipping without installing templates", exc)
                break
        self._templates_done = True

    def _ship_segment(self, segment: Segment) -> None:
        pending = list(read_segment(segment.path))
        limit = self._settings.bulk_max_documents
        while pending:
            batch = self._batch(pending, limit)
            try:
                retry = self._send(batch)
            except RetryableError as exc:
                self._metrics.bulk_requests.labels(result="retry").inc()
                self._metrics.retried.labels(reason=_reason(exc)).inc(len(batch))
                self._backoff(f"bulk request failed: {exc}")
                continue
            except ElasticsearchError as exc:
                # Never stop shipping: the documents stay in the spool until Elasticsearch
                # takes them. A request refused as a whole for its content (400, 413) is split
                # until the one document it cannot take goes to the dead-letter file; anything
                # else (401, 403, 500, ...) is retried with backoff until someone fixes it.
                self._metrics.bulk_requests.labels(result="error").inc()
                if exc.status in (400, 413):
                    if len(batch) > 1:
                        limit = max(1, len(batch) // 2)
                        continue
                    self._dead_letter([(batch[0], {"status": exc.status, "error": str(exc)})])
                    pending = pending[1:]
                    limit = self._settings.bulk_max_documents
                    continue
                self._metrics.retried.labels(reason=f"http_{exc.status or 'error'}").inc(len(batch))
                self._backoff(f"bulk request refused: {exc}")
                continue
            done = len(batch) - len(retry)
            pending = retry + pending[len(batch) :]
            if retry:
                self._backoff(f"{len(retry)} documents refused with a retryable status")
            elif done:
                self._failures = 0
        self._spool.remove(segment)
        self._metrics.last_shipped.set_to_current_time()

    def _batch(self, pending: Sequence[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        size = 0
        for doc in pending:
            size += len(json.dumps(doc)) + 100
            if batch and (len(batch) >= limit or size > self._settings.bulk_max_bytes):
                break
            batch.append(doc)
        return batch

    def _send(self, batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """One bulk request; returns the documents to send again."""
        operations: list[Mapping[str, Any]] = []
        for doc in batch:
            operations.append({"create": {"_index": stream_of(doc), "_id": doc["event"]["id"]}})
            operations.append(doc)
        client = self._get_client()
        try:
            response = client.options(request_timeout=self._request_timeout()).bulk(
                operations=operations
            )
        except CLIENT_ERRORS as exc:
            raise wrap(exc, "bulk request") from exc
        items = response.body.get("items") or []
        if len(items) != len(batch):
            raise RetryableError(f"bulk response has {len(items)} items for {len(batch)} documents")
        retry: list[dict[str, Any]] = []
        dead: list[tuple[dict[str, Any], Mapping[str, Any]]] = []
        for doc, item in zip(batch, items, strict=True):
            result = next(iter(item.values()))
            status = int(result.get("status", 0))
            if 200 <= status < 300:
                self._metrics.shipped.labels(result="created").inc()
            elif status == 409:
                self._metrics.shipped.labels(result="duplicate").inc()
            elif status in RETRYABLE_STATUSES:
                self._metrics.retried.labels(reason=f"item_{status}").inc()
                retry.append(doc)
            else:
                dead.append((doc, result))
        if dead:
            self._dead_letter(dead)
        self._metrics.bulk_requests.labels(result="ok").inc()
        return retry

    def _dead_letter(self, dead: Sequence[tuple[dict[str, Any], Mapping[str, Any]]]) -> None:
        directory = self._settings.dead_letter_dir
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        with (directory / "dead-letter.jsonl").open("ab") as fh:
            for doc, result in dead:
                error = result.get("error") or {}
                reason = error.get("reason") if isinstance(error, Mapping) else str(error)
                entry = {
                    "@timestamp": now,
                    "status": result.get("status"),
                    "reason": reason,
                    "error": error,
                    "index": stream_of(doc),
                    "document": doc,
                }
                fh.write((json.dumps(entry, ensure_ascii=False) + "\n").encode())
                log.error(
                    "Elasticsearch refused audit document %s (HTTP %s): %s; written to %s",
                    doc["event"]["id"],
                    result.get("status"),
                    reason,
                    directory / "dead-letter.jsonl",
                )
            fh.flush()
            os.fsync(fh.fileno())
        self._metrics.dead_lettered.inc(len(dead))

    # -- helpers ----------------------------------------------------------------------------

    def _get_client(self) -> Elasticsearch:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    def _request_timeout(self) -> float:
        timeout = self._settings.request_timeout_s
        if self._closing.is_set():
            timeout = min(timeout, max(0.1, self._deadline - time.monotonic()))
        return timeout

    def _backoff(self, why: str) -> None:
        """Wait before the next try (doubling, with jitter); raise ``_GiveUp`` when closing."""
        self._failures += 1
        base = self._settings.backoff_initial_s * 2 ** min(self._failures - 1, 30)
        delay = min(self._settings.backoff_max_s, base) * random.uniform(0.5, 1.0)
        if self._closing.is_set():
            if time.monotonic() + delay > self._deadline:
                raise _GiveUp
            self._closing_pause.wait(delay)  # never set: close() already woke us once
            return
        log.warning("%s; retrying in %.1fs", why, delay)
        if self._wake.wait(delay):
            self._wake.clear()


def _reason(exc: Exception) -> str:
    text = str(exc)
    for status in sorted(RETRYABLE_STATUSES):
        if f"HTTP {status}" in text:
            return f"http_{status}"
    return "connection"
