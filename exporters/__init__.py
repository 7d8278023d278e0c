"""Metric sources for gpuops: the NVML exporter (``exporters.nvml``) and the simulated GPU fleet
(``exporters.fleet``). Nothing here imports the engine; both speak only Prometheus and HTTP."""
