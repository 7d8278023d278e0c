"""Exceptions of the audit trail, raised at its I/O boundaries (spool files, Elasticsearch).

The Elasticsearch client's errors are wrapped with the original chained as ``__cause__``;
bodies in messages are capped at 256 characters. Raised by the spool, the template installer
and the search backends; ``AuditLog.decision`` and friends never raise them to the engine;
``AuditLog.write_ahead`` raises ``AuditWriteError`` so that the engine's gate does not act
unaudited.
"""

from __future__ import annotations

MAX_BODY = 256


def cap(text: object) -> str:
    """``text`` as a string of at most 256 characters (response bodies in messages and logs)."""
    value = str(text)
    return value if len(value) <= MAX_BODY else value[: MAX_BODY - 1] + "…"


class AuditError(Exception):
    """Base of the audit trail's errors."""


class AuditWriteError(AuditError):
    """A document that must be durable before the engine acts could not be written to the
    spool (disk full, spool unwritable, spool full under ``fail_closed``)."""


class SpoolLockedError(AuditError):
    """Another process already writes to this spool directory."""


class ElasticsearchError(AuditError):
    """Elasticsearch could not be reached or answered with an error (``status``: its HTTP
    status, when it answered)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RetryableError(ElasticsearchError):
    """A 429/502/503/504, a timeout or a refused connection: try again later."""


class TemplateError(AuditError):
    """A template file is missing or invalid, or Elasticsearch refused it."""
