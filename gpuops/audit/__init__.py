"""The audit trail: every decision and user operation as an ECS document,
spooled on local disk and shipped to Elasticsearch data streams.

Used by ``gpuops.runtime`` (decisions, skipped evaluations), ``gpuops.api`` and ``gpuops.cli``
(user operations, ``gpuops audit``, ``gpuops elk``). Sits in the I/O layer: it imports
``gpuops.model.decisions`` (and the Slurm client, for job events) and nothing above it.

From the bottom up: ``errors``, ``settings`` and ``metrics``; ``documents`` (the ECS
documents, pure) and ``lines`` (each as its spool entry: bulk action line and JSON line);
``client`` (the Elasticsearch client, its errors wrapped); ``spool`` (the segments on disk,
read and written), ``templates`` (the index templates installed) and ``query`` (filters that
run as query DSL and over spooled documents); ``shipping`` (the spool to Elasticsearch) and
``search`` (documents found in Elasticsearch or in the spool); ``log`` (``AuditLog``, the
front door), ``anomalies`` (``gpuops audit anomalies``) and ``jobs`` (Slurm job runs as
events).
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
