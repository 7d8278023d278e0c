"""The exceptions of the sources layer, raised where the engine reads metrics.

    PrometheusError     base of what ``gpuops.sources`` raises about a Prometheus
    └── QueryError      a query did not produce a usable result: nothing may be concluded

Raised by the Prometheus client (``gpuops.sources.prometheus``, the transport's error chained
as the cause) and by the PromQL analysis (``gpuops.sources.promql``, for a query it cannot
read); ``gpuops.runtime`` turns a ``QueryError`` into a skipped evaluation, ``gpuops.offline``
into a failed backtest. Texts quoted in messages are capped at ``MAX_ERROR_CHARS``.
"""

from __future__ import annotations

MAX_ERROR_CHARS = 256


class PrometheusError(Exception):
    """Base of what the sources layer raises."""


class QueryError(PrometheusError):
    """A query did not produce a usable result; nothing may be concluded from it."""


def capped(exc: BaseException | str) -> str:
    """``exc``'s text, cut after ``MAX_ERROR_CHARS`` characters (marked with ``…``)."""
    text = str(exc)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"
