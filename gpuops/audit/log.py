"""``AuditLog``: the audit trail's front door.

Called by ``gpuops.runtime`` for every decision, outcome and skipped evaluation, and by
``gpuops.api`` / ``gpuops.cli`` for every user operation (a successful read is counted, not
written: ``read``). Each call turns its values into one
ECS document (``gpuops.audit.documents``; decisions straight to their JSON,
``gpuops.audit.lines``), appends it fsync'd to the spool and returns its
``event.id``; the shipper thread sends the spool to Elasticsearch. No call ever waits for
Elasticsearch or raises because of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elasticsearch import Elasticsearch
from prometheus_client import CollectorRegistry

from gpuops.audit.client import make_client
from gpuops.audit.documents import (
    clock_step_document,
    leadership_document,
    operation_document,
    skipped_document,
)
from gpuops.audit.errors import AuditWriteError
from gpuops.audit.lines import decision_entry, entry
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.settings import AuditSettings
from gpuops.audit.shipping import Shipper
from gpuops.audit.spool import Spool
from gpuops.model.decisions import Decision, Outcome, SkippedEvaluation

log = logging.getLogger(__name__)


class AuditLog:
    """Spools audit documents and ships them to Elasticsearch in the background."""

    def __init__(
        self,
        settings: AuditSettings,
        host_name: str,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        client_factory: Callable[[], Elasticsearch] | None = None,
    ) -> None:
        """Open the spool (taking its writer lock). ``registry``: where the metrics go (a
        private registry when None); ``clock``: wall-clock seconds for ``event.created`` and
        operations' ``@timestamp``; ``client_factory``: builds the Elasticsearch client."""
        self.settings = settings
        self.host_name = host_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = AuditMetrics(self.registry)
        self._clock = clock
        self._spool = Spool(
            settings.spool_dir,
            segment_max_bytes=settings.segment_max_bytes,
            segment_max_age_s=settings.segment_max_age_s,
            max_bytes=settings.max_spool_bytes,
            full_policy=settings.full_policy,
            fsync=settings.fsync,
            metrics=self.metrics,
        )
        self._spool.open()
        self._shipper: Shipper | None = None
        if settings.elasticsearch_url:
            factory = client_factory or (lambda: make_client(settings))
            self._shipper = Shipper(self._spool, settings, self.metrics, factory)
        self._closed = False

    @property
    def spool_dir(self) -> Path:
        return self.settings.spool_dir

    @property
    def pending(self) -> int:
        """Documents in the spool not yet acknowledged by Elasticsearch."""
        return self._spool.documents

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the shipper thread (nothing to do without ``elasticsearch_url``)."""
        if self._shipper is not None:
            self._shipper.start()
            log.info("audit: shipping %s to %s", self.spool_dir, self.settings.elasticsearch_url)
        else:
            log.info("audit: no Elasticsearch configured; %s is the audit store", self.spool_dir)

    def close(self) -> None:
        """Ship what can be shipped within ``close_timeout_s``, stop, release the spool."""
        if self._closed:
            return
        self._closed = True
        if self._shipper is not None:
            self._shipper.stop(self.settings.close_timeout_s)
        self._spool.close()

    def __enter__(self) -> AuditLog:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recording --------------------------------------------------------------------------

    def decision(self, decision: Decision, outcome: Outcome | None) -> str:
        """Record a decision (``outcome`` None when not executed); returns its ``event.id``."""
        return self._append_entry(
            decision_entry(
                decision, outcome, self.host_name, self.settings.namespace, self._clock()
            )
        )

    def write_ahead(self, entries: Sequence[tuple[Decision, Outcome | None]]) -> list[str]:
        """Record decisions (and outcomes) durably with one fsync, or raise ``AuditWriteError``
        (nothing written): the engine's gate calls it before it acts, and acts only if it
        returns. Returns the documents' ``event.id``s."""
        now = self._clock()
        host, namespace = self.host_name, self.settings.namespace
        built = [decision_entry(d, o, host, namespace, now) for d, o in entries]
        try:
            stored = self._spool.append_entries([data for _, data in built])
        except OSError as exc:
            self.metrics.dropped.labels(policy="write_error").inc(len(built))
            raise AuditWriteError(f"audit spool {self.spool_dir} not writable: {exc}") from exc
        if not stored:
            raise AuditWriteError(
                f"audit spool {self.spool_dir} is full ({self._spool.size} bytes, "
                f"{self._spool.documents} documents not yet shipped; max_spool_bytes "
                f"{self.settings.max_spool_bytes}, full_policy fail_closed)"
            )
        return [doc_id for doc_id, _ in built]

    def skipped(self, skipped: SkippedEvaluation) -> str:
        """Record an evaluation skipped because its query failed; returns its ``event.id``."""
        doc = skipped_document(skipped, self.host_name, self.settings.namespace, self._clock())
        return self._append(doc)

    def clock_step(self, step_s: float, at: float) -> str:
        """Record a wall-clock step of ``step_s`` seconds seen at ``at``; returns its id."""
        doc = clock_step_document(
            step_s, at, self.host_name, self.settings.namespace, self._clock()
        )
        return self._append(doc)

    def leadership(self, elected: bool, replica: str, epoch: int, reason: str, at: float) -> str:
        """Record that replica ``replica`` became the leader (``elected``) or stopped leading
        with lease epoch ``epoch``; returns its id."""
        doc = leadership_document(
            elected,
            replica,
            epoch,
            reason,
            at,
            self.host_name,
            self.settings.namespace,
            self._clock(),
        )
        return self._append(doc)

    def operation(
        self,
        user: str,
        roles: Sequence[str],
        action: str,
        outcome: str,
        source_ip: str | None,
        message: str,
        details: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> str:
        """Record a user operation (API call, CLI operation, failed login); returns its id.

        ``outcome``: success | failure | unknown.
        """
        doc = operation_document(
            user=user,
            roles=roles,
            action=action,
            outcome=outcome,
            source_ip=source_ip,
            message=message,
            details=details,
            error=error,
            host_name=self.host_name,
            namespace=self.settings.namespace,
            now=self._clock(),
        )
        return self._append(doc)

    def read(self, user: str, route: str, via: str) -> None:
        """Count a successful read (a page view, a list or show call) of ``route`` by ``user``
        through ``via`` (api, console): ``gpuops_audit_reads_total``, no document (docs/audit.md:
        reads are counted, every change and every refusal is a document)."""
        self.metrics.reads.labels(route=route, user=user, via=via).inc()

    def record(self, doc: dict[str, Any]) -> str:
        """Append a document another module built (Slurm job events: ``gpuops.audit.jobs``)."""
        return self._append(doc)

    def _append(self, doc: dict[str, Any]) -> str:
        return self._append_entry(entry(doc))

    def _append_entry(self, built: tuple[str, bytes]) -> str:
        event_id, data = built
        try:
            stored = self._spool.append_entries([data])
        except OSError as exc:
            self.metrics.dropped.labels(policy="write_error").inc()
            log.error("audit: could not write document %s to the spool: %s", event_id, exc)
        else:
            if not stored:  # the spool logs that it is full (at most every 10 s)
                self.metrics.dropped.labels(policy=self.settings.full_policy).inc()
        return event_id
