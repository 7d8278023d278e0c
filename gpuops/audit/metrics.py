"""Prometheus metrics of the audit trail, registered on the registry the caller passes in.

Created by ``AuditLog``; updated by the spool (depth, drops) and the shipper (shipped, retried,
dead-lettered). Exposed on the engine's ``/metrics`` by ``gpuops.runtime``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AuditMetrics:
    """The audit trail's counters and gauges (prefix ``gpuops_audit_``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.spool_documents = Gauge(
            "gpuops_audit_spool_documents",
            "Audit documents in the local spool, not yet acknowledged by Elasticsearch.",
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "gpuops_audit_spool_bytes",
            "Size of the local audit spool on disk.",
            registry=registry,
        )
        self.spool_limit_bytes = Gauge(
            "gpuops_audit_spool_limit_bytes",
            "Configured upper bound of the local audit spool.",
            registry=registry,
        )
        self.spooled = Counter(
            "gpuops_audit_spooled_documents",
            "Audit documents appended (and fsync'd) to the spool.",
            registry=registry,
        )
        self.dropped = Counter(
            "gpuops_audit_dropped_documents",
            "Audit documents lost because the spool was full, by full policy.",
            ["policy"],
            registry=registry,
        )
        self.shipped = Counter(
            "gpuops_audit_shipped_documents",
            "Audit documents acknowledged by Elasticsearch (result: created, or duplicate: 409).",
            ["result"],
            registry=registry,
        )
        self.last_shipped = Gauge(
            "gpuops_audit_last_shipped_timestamp_seconds",
            "When a spool segment was last acknowledged by Elasticsearch (0: not yet).",
            registry=registry,
        )
        self.retried = Counter(
            "gpuops_audit_retried_documents",
            "Audit documents sent again after a retryable failure, by reason.",
            ["reason"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "gpuops_audit_dead_lettered_documents",
            "Audit documents refused by Elasticsearch for good, written to the dead-letter file.",
            registry=registry,
        )
        self.bulk_requests = Counter(
            "gpuops_audit_bulk_requests",
            "Bulk requests sent to Elasticsearch, by result (ok, retry, error).",
            ["result"],
            registry=registry,
        )
        self.reads = Counter(
            "gpuops_audit_reads",
            "Successful reads of the API and the console (page views, list and show calls), "
            "counted here instead of one audit document each, by route, user and via "
            "(api, console).",
            ["route", "user", "via"],
            registry=registry,
        )
        self.template_installs = Counter(
            "gpuops_audit_template_installs",
            "Attempts to install the Elasticsearch templates, by result (ok, error).",
            ["result"],
            registry=registry,
        )
