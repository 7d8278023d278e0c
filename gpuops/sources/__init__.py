"""Where the engine reads metrics: ``prometheus`` (the client of the Prometheus HTTP API: instant
and range queries, the stale-series probe, narrowed queries) and ``promproc`` (Prometheus,
Alertmanager and VictoriaMetrics processes for the demo, the what-if, backtests over a TSDB
directory and tests)."""
