"""How the spool reaches Elasticsearch: ``shipments`` (a sealed segment's spooled bytes as a
ready ``_bulk`` body, sent in runs of its documents), ``deadletter`` (the file of documents
refused for good), ``bulk`` (one bulk request and its answer, item by item) and ``shipper``
(``Shipper``: the background thread that batches, retries with backoff and removes what was
acknowledged)."""

from gpuops.audit.shipping.shipper import Shipper

__all__ = ["Shipper"]
