"""The audit trail (DESIGN.md section 8): every decision and user operation as an ECS document,
spooled on local disk and shipped to Elasticsearch data streams.

Used by ``engine.runtime`` (decisions, skipped evaluations), ``engine.api`` and ``engine.cli``
(user operations, ``gpuops audit``, ``gpuops elk``). Sits in the I/O layer: it imports
``engine.decisions`` and nothing above it.
"""

from engine.audit.errors import AuditError, AuditWriteError, ElasticsearchError, SpoolLockedError
from engine.audit.log import AuditLog
from engine.audit.settings import AuditSettings

__all__ = [
    "AuditError",
    "AuditWriteError",
    "AuditLog",
    "AuditSettings",
    "ElasticsearchError",
    "SpoolLockedError",
]
