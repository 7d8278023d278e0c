"""The NVML exporter and node agent (``gpuops exporter nvml``).

``nvml`` is the one module that imports pynvml; ``fake`` and ``scenarios`` stand in for it in tests
and demos; ``session`` owns initialisation, ``collector`` turns NVML reads into Prometheus
families, ``events`` counts XID errors, ``agent`` changes clocks and power limits, and ``server``
serves ``/metrics`` and the agent's endpoint. ``gpuops.cli.exporter`` starts it.
"""
