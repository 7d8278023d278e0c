"""The audit trail: every decision and user operation as an ECS document,
spooled on local disk and shipped to Elasticsearch data streams.

Used by ``gpuops.runtime`` (decisions, skipped evaluations), ``gpuops.api`` and ``gpuops.cli``
(user operations, ``gpuops audit``, ``gpuops elk``). Sits in the I/O layer: it imports
``gpuops.model.decisions`` and nothing above it.
"""

from gpuops.audit.errors import AuditError, AuditWriteError, ElasticsearchError, SpoolLockedError
from gpuops.audit.log import AuditLog
from gpuops.audit.settings import AuditSettings

__all__ = [
    "AuditError",
    "AuditWriteError",
    "AuditLog",
    "AuditSettings",
    "ElasticsearchError",
    "SpoolLockedError",
]
