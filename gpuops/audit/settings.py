"""Settings of the audit trail: where the spool lives, how big it may grow,
where Elasticsearch is and how the shipper talks to it.

Built by ``gpuops.runtime`` / ``gpuops.cli`` from the engine configuration and handed to
``gpuops.audit.AuditLog``. Every field has a default and says its unit and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

FullPolicy = Literal["fail_closed", "drop_oldest"]


def default_templates_dir() -> Path:
    """``elk/elasticsearch`` of the source tree (the Docker image ships it at the same place)."""
    return Path(__file__).resolve().parents[2] / "elk" / "elasticsearch"


@dataclass(frozen=True)
class AuditSettings:
    """How audit documents are spooled and shipped."""

    spool_dir: Path
    """Directory of the spool segments (``segment-<seq>.ndjson``); created when missing."""

    elasticsearch_url: str | None = None
    """``http(s)://host:9200``; None: no shipper, the spool is the audit store."""

    elasticsearch_api_key: str | None = field(default=None, repr=False)
    """API key (base64 ``id:key``) sent as ``Authorization: ApiKey``; never logged."""

    elasticsearch_username: str | None = None
    """User name of basic authentication (with ``elasticsearch_password``)."""
    elasticsearch_password: str | None = field(default=None, repr=False)
    """Basic authentication, used when no API key is given; never logged."""

    ca_certs: Path | None = None
    """CA bundle for an https URL signed by a private CA."""

    segment_max_bytes: int = 4 * 1024 * 1024
    """A segment is sealed (and becomes shippable) when it reaches this size, in bytes."""

    segment_max_age_s: float = 1.0
    """...or when its first document is this many seconds old: bounds audit latency."""

    max_spool_bytes: int = 280 * 1024 * 1024
    """Upper bound of the spool on disk, in bytes: about 210k decision documents of ~1.4 KB,
    each with its bulk action line."""

    full_policy: FullPolicy = "fail_closed"
    """What happens when the spool is full. ``fail_closed`` (default): nothing already spooled
    is ever deleted; new documents are refused as on a full disk, so the engine's write-ahead
    fails and no action runs (``/healthz`` red with the reason) until the shipper has made
    room; other documents (skipped evaluations, user operations) are lost, logged at ERROR and
    counted in ``gpuops_audit_dropped_documents_total{policy="fail_closed"}``. Without
    Elasticsearch nothing is ever shipped: size ``max_spool_bytes`` for the retention you want.
    ``drop_oldest``: retention instead of audit: delete the oldest sealed segments, shipped or
    not, until the new document fits (like Fluent Bit's ``storage.total_limit_size``); the loss
    is logged at ERROR and counted under ``policy="drop_oldest"``."""

    fsync: bool = True
    """fsync every append before it returns (``decision()``, ``write_ahead()``; concurrent
    appends share one fsync): an acknowledged event survives a crash of the process and of the
    machine. Turning it off survives only the former."""

    bulk_max_documents: int = 4000
    """Most documents per bulk request; the shipper starts at a quarter of it and adapts."""

    bulk_min_documents: int = 50
    """Fewest documents per bulk request the adaptive size shrinks to (429s, slow answers)."""

    bulk_max_bytes: int = 5 * 1024 * 1024
    """Bytes of NDJSON per bulk request (Elasticsearch's advice: a few MiB)."""

    bulk_in_flight: int = 3
    """Bulk requests sent at once (2-4 keeps an Elasticsearch node's write threads busy
    without queueing behind each other)."""

    bulk_target_s: float = 1.0
    """A bulk request slower than this, in seconds, halves the batch size; faster ones grow it
    by a quarter (up to ``bulk_max_documents``)."""

    request_timeout_s: float = 10.0
    """Timeout of one request to Elasticsearch, in seconds."""

    backoff_initial_s: float = 0.5
    """First retry delay after a 429/502/503/504 or a connection error, doubled each time."""

    backoff_max_s: float = 30.0
    """Longest retry delay, in seconds: a long outage is polled this often."""

    poll_interval_s: float = 0.5
    """How often the shipper looks for work when nothing wakes it, in seconds."""

    close_timeout_s: float = 5.0
    """How long ``close()`` keeps shipping what is left before it leaves it in the spool."""

    install_templates: bool = True
    """Install the index templates, component templates and ILM policy before shipping."""

    templates_dir: Path = field(default_factory=default_templates_dir)
    """Where the template JSON files are (``elk/elasticsearch``)."""

    namespace: str = "default"
    """Data stream namespace: documents go to ``logs-gpuops.decision-<namespace>`` and
    ``logs-gpuops.audit-<namespace>``."""

    @property
    def dead_letter_dir(self) -> Path:
        """Documents Elasticsearch refused for good, with the reason (``dead-letter.jsonl``)."""
        return self.spool_dir / "dead-letter"
