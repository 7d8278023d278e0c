"""The one place that builds the Elasticsearch client and classifies its errors.

Used by the shipper, the template installer and the Elasticsearch search backend. The client
does no retries of its own (``max_retries=0``): the shipper retries with its own backoff, so a
retry is visible in ``gpuops_audit_retried_documents_total``.
"""

from __future__ import annotations

from typing import Any

from elastic_transport import ConnectionError as TransportConnectionError
from elastic_transport import ConnectionTimeout, TransportError
from elasticsearch import ApiError, Elasticsearch, UnsupportedProductError
from elasticsearch.serializer import NdjsonSerializer, OrjsonSerializer

from gpuops.audit.errors import ElasticsearchError, RetryableError, cap
from gpuops.audit.settings import AuditSettings

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


class SpooledNdjsonSerializer(NdjsonSerializer):
    """The bulk body the shipper hands over (the spooled bytes, ending with a newline) sent as
    it is: the client's NDJSON serializer copies a bytes body twice (into a ``bytearray``,
    then out of it) before the transport sends it. Anything else is serialized by that
    serializer."""

    def dumps(self, data: Any) -> bytes:
        if type(data) is bytes and data.endswith(b"\n"):
            return data
        return super().dumps(data)


def make_client(settings: AuditSettings, url: str | None = None) -> Elasticsearch:
    """A client for ``url`` (default: the settings' URL) with the settings' credentials."""
    target = url or settings.elasticsearch_url
    if not target:
        raise ElasticsearchError("no Elasticsearch URL configured")
    auth: dict[str, object] = {}
    if settings.elasticsearch_api_key:
        auth["api_key"] = settings.elasticsearch_api_key
    elif settings.elasticsearch_username:
        auth["basic_auth"] = (
            settings.elasticsearch_username,
            settings.elasticsearch_password or "",
        )
    if settings.ca_certs is not None:
        auth["ca_certs"] = str(settings.ca_certs)
    return Elasticsearch(
        target,
        request_timeout=settings.request_timeout_s,
        max_retries=0,
        retry_on_timeout=False,
        # responses (a bulk answer has an item per document) parsed in C; the shipper's bulk
        # bodies are the spool's bytes, passed through (also for the compatibility mimetype)
        serializers={
            "application/json": OrjsonSerializer(),
            "application/x-ndjson": SpooledNdjsonSerializer(),
        },
        **auth,  # type: ignore[arg-type]
    )


def wrap(exc: Exception, what: str) -> ElasticsearchError:
    """Our exception for one of the client's, retryable or not (chain it: ``from exc``)."""
    if isinstance(exc, UnsupportedProductError):
        return RetryableError(
            f"{what}: not Elasticsearch (no X-Elastic-Product header): {cap(exc)}"
        )
    if isinstance(exc, ApiError):
        status = exc.meta.status
        message = f"{what}: HTTP {status}: {cap(exc.body)}"
        if status in RETRYABLE_STATUSES:
            return RetryableError(message, status)
        return ElasticsearchError(message, status)
    if isinstance(exc, ConnectionTimeout | TransportConnectionError):
        return RetryableError(f"{what}: {type(exc).__name__}: {cap(exc)}")
    if isinstance(exc, TransportError):
        return RetryableError(f"{what}: {type(exc).__name__}: {cap(exc)}")
    return ElasticsearchError(f"{what}: {type(exc).__name__}: {cap(exc)}")


CLIENT_ERRORS = (ApiError, TransportError)
"""What the client raises (catch these and ``wrap`` them)."""
