"""One bulk request: runs of spooled documents sent to Elasticsearch's ``_bulk`` API, and its
answer read item by item.

Run on a pool thread of ``gpuops.audit.shipping.shipper.Shipper`` (``send``), which reads the
``BulkResult``: it never raises. Each document goes with op_type ``create`` and
``_id = event.id`` (its action line, as spooled), so a document sent twice (a retry, a restart
after a crash) is a 409, which counts as stored. Items refused with 429/502/503/504 come back
as runs to retry; any other item error sends the document to the dead-letter file
(``gpuops.audit.shipping.deadletter``) with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from elasticsearch import Elasticsearch

from gpuops.audit.client import CLIENT_ERRORS, RETRYABLE_STATUSES, wrap
from gpuops.audit.errors import ElasticsearchError, RetryableError
from gpuops.audit.metrics import AuditMetrics
from gpuops.audit.shipping.deadletter import DeadLetters, Refused
from gpuops.audit.shipping.shipments import Run, documents, size

log = logging.getLogger(__name__)

FILTER_PATH = "errors,items.*.status,items.*.error"
"""What a bulk answer needs to carry back (Elasticsearch's ``filter_path``): its items without
the ids, versions and shards the shipper never reads (an eighth of the bytes to parse)."""


@dataclass
class BulkResult:
    """What one bulk request came back with."""

    batch: list[Run]
    retry: list[Run] = field(default_factory=list)
    error: ElasticsearchError | None = None
    seconds: float = 0.0
    throttled: bool = False


def send(
    client: Callable[[], Elasticsearch],
    batch: Sequence[Run],
    metrics: AuditMetrics,
    dead_letters: DeadLetters,
) -> BulkResult:
    """One bulk request of ``batch`` through ``client()`` (the client with the bulk request
    timeout); never raises (the shipper thread reads the result)."""
    result = BulkResult(list(batch))
    count = size(batch)
    # the spooled bytes as they are: one slice per run, joined once; the client sends
    # them without copying (``client.SpooledNdjsonSerializer``)
    body = b"".join([w.data[w.starts[lo] : w.starts[hi]] for w, lo, hi in batch])
    started = time.monotonic()
    try:
        response = client().bulk(
            operations=body,  # type: ignore[arg-type]  # NDJSON bytes are sent as they are
            filter_path=FILTER_PATH,
        )
    except CLIENT_ERRORS as exc:
        result.error = wrap(exc, "bulk request")
        return result
    except Exception as exc:  # a bug in here must not lose the batch: it is retried
        log.exception("audit: bulk request failed unexpectedly")
        result.error = RetryableError(f"bulk request: {type(exc).__name__}: {exc}")
        return result
    finally:
        result.seconds = time.monotonic() - started
    items = response.body.get("items") or []
    if len(items) != count:
        result.error = RetryableError(f"bulk response has {len(items)} items for {count} documents")
        return result
    if response.body.get("errors") is False:  # every item created (a 409 is an error)
        metrics.shipped.labels(result="created").inc(count)
        metrics.bulk_requests.labels(result="ok").inc()
        return result
    dead: list[Refused] = []
    created = duplicates = 0
    for item, answer in zip(documents(batch), items, strict=True):
        outcome = next(iter(answer.values()))
        status = int(outcome.get("status", 0))
        if 200 <= status < 300:
            created += 1
        elif status == 409:
            duplicates += 1
        elif status in RETRYABLE_STATUSES:
            metrics.retried.labels(reason=f"item_{status}").inc()
            result.retry.append((item[0], item[1], item[1] + 1))
            result.throttled = result.throttled or status == 429
        else:
            dead.append((item, outcome))
    metrics.shipped.labels(result="created").inc(created)
    metrics.shipped.labels(result="duplicate").inc(duplicates)
    if dead:
        try:
            dead_letters.write(dead)
        except OSError:  # kept in the spool: sent (and refused) again after a backoff
            log.exception("audit: the dead-letter file is not writable")
            result.retry += [(shipment, k, k + 1) for (shipment, k), _ in dead]
    metrics.bulk_requests.labels(result="ok").inc()
    return result
