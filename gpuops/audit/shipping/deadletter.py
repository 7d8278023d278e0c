"""The dead-letter file: documents Elasticsearch refused for good, with the reason.

Written by the shipper (``gpuops.audit.shipping.bulk`` for an item a bulk answer refused,
``gpuops.audit.shipping.shipper`` for a document a request of its own cannot carry) before the
document's segment may be removed from the spool: ``<dead_letter_dir>/dead-letter.jsonl``, one
JSON object a line, fsync'd. A refused document that cannot be written here stays in the spool
(the caller sends it again after a backoff).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.shipping.shipments import Shipment

log = logging.getLogger(__name__)

Refused = tuple[tuple[Shipment, int], Mapping[str, Any]]
"""A document (its shipment and number) and what Elasticsearch said of it: a bulk item's
answer as JSON (``status``, ``error``)."""


class DeadLetters:
    """The dead-letter file of one spool's shipper."""

    def __init__(self, directory: Path, metrics: AuditMetrics) -> None:
        self.directory = directory
        self._metrics = metrics

    def write(self, dead: Sequence[Refused]) -> None:
        """Append ``dead``, fsync'd; ``OSError`` when the file is not writable."""
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        with (directory / "dead-letter.jsonl").open("ab") as fh:
            for (shipment, k), result in dead:
                error = result.get("error") or {}
                reason = error.get("reason") if isinstance(error, Mapping) else str(error)
                entry = {
                    "@timestamp": now,
                    "status": result.get("status"),
                    "reason": reason,
                    "error": error,
                    "index": shipment.action_field(k, "_index"),
                }
                line = shipment.entry(k)[1]
                try:
                    entry["document"] = orjson.loads(line)
                except ValueError:  # a corrupt spool line: its bytes as they are, losing nothing
                    entry["document_raw"] = line.decode("utf-8", errors="backslashreplace")
                fh.write(orjson.dumps(entry, default=str) + b"\n")
                log.error(
                    "Elasticsearch refused audit document %s (HTTP %s): %s; written to %s",
                    shipment.action_field(k, "_id"),
                    result.get("status"),
                    reason,
                    directory / "dead-letter.jsonl",
                )
            fh.flush()
            os.fsync(fh.fileno())
        self._metrics.dead_lettered.inc(len(dead))
