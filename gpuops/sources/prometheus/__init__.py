"""The Prometheus client, a ``gpuops.sources.interface.MetricsSource``: ``client`` (the HTTP
client of the query API, and its errors as ``QueryError``), ``answers`` (the last answer to
each query, recognised again so that only its values are read) and ``vectors`` (answers decoded
into columns)."""

from gpuops.sources.prometheus.answers import Answers
from gpuops.sources.prometheus.client import PrometheusClient
from gpuops.sources.prometheus.vectors import decode_vector, parse_vector

__all__ = ["Answers", "PrometheusClient", "decode_vector", "parse_vector"]
