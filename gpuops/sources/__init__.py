"""Where the engine reads metrics, from the bottom up: ``errors`` (``QueryError``: an answer
nothing may be concluded from), ``interface`` (``MetricsSource``, the Protocol the runtime,
the backtest and the what-if annotate with), ``promql`` (PromQL analysis, pure: input
selectors, join labels, the stale-series probe, narrowing), ``prometheus`` (the client of the
Prometheus HTTP API: instant and range queries, answers decoded into columns) and
``promproc`` (Prometheus, Alertmanager and VictoriaMetrics processes for the demo, the
what-if, backtests over a TSDB directory and tests).

Sits in the I/O layer: imports ``gpuops.model.decisions`` and nothing else of the engine.
"""

from gpuops.sources.errors import PrometheusError, QueryError
from gpuops.sources.interface import MetricsSource

__all__ = ["MetricsSource", "PrometheusError", "QueryError"]
