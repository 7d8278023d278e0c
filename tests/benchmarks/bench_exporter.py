"""Exporter scrape cost (issues 6 and 15): the exporter's own CPU time per
scrape for 8 and 64 fake GPUs, and the process RSS. Prints figures; never fails on noise.

Run: ``python -m tests.benchmarks.bench_exporter`` or ``python tests/benchmarks/bench_exporter.py``.
The fake NVML answers instantly, so NVML latency is excluded; the time its Python methods take
is measured on a second, wrapped instance and subtracted; the raw figure is printed too.
``/metrics`` serves ``NvmlCollector.render()`` (the "exporter ms" column); the same scrape through
prometheus_client's generic ``generate_latest`` path, which ``/metrics`` served before issue 15,
is printed next to it. Target (issue 15): <= 1 ms per scrape for 8 GPUs, <= 8 ms for 64.
Before issue 15 (main at da5125a, this machine, 2 loaded cores): 5.0 ms / 22.6 ms; the issue
measured 2.39 / 21.2 ms.
"""

from __future__ import annotations

import resource
import time
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from gpuops.exporters.nvml.collector import NvmlCollector
from gpuops.exporters.nvml.scenarios import healthy_h100
from gpuops.exporters.nvml.session import NvmlSession


class _Timed:
    """Wraps a fake NVML, adding up the CPU time spent inside its methods."""

    def __init__(self, fake: Any) -> None:
        self._fake = fake
        self.spent = 0.0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fake, name)
        if not callable(target):
            return target

        def call(*args: Any) -> Any:
            started = time.process_time()
            try:
                return target(*args)
            finally:
                self.spent += time.process_time() - started

        return call


def _registry(backend: Any) -> tuple[CollectorRegistry, NvmlCollector]:
    registry = CollectorRegistry()
    collector = NvmlCollector(NvmlSession(backend))
    registry.register(collector)
    for _ in range(20):  # initialise NVML and warm up outside the measurement
        generate_latest(registry)
    return registry, collector


def _cpu_ms(call: Any, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - started) / repeat * 1000


def measure(gpus: int, scrapes: int) -> dict[str, float]:
    """CPU milliseconds per scrape: raw, inside the fake NVML, the generic path, and the
    exporter's own (``render()``, what ``/metrics`` serves)."""
    registry, collector = _registry(healthy_h100(gpus))
    raw = _cpu_ms(collector.render, scrapes)
    generic = _cpu_ms(lambda: generate_latest(registry), scrapes)
    timed = _Timed(healthy_h100(gpus))  # a second exporter, only to time the fake's methods
    _, timed_collector = _registry(timed)
    timed.spent = 0.0
    _cpu_ms(timed_collector.render, scrapes)
    fake = timed.spent / scrapes * 1000
    return {
        "raw": raw,
        "fake": fake,
        "generic": generic - fake,
        "own": raw - fake,
        "bytes": float(len(collector.render())),
    }


def main() -> None:
    print("NVML exporter scrape cost (fake NVML, CPU time per scrape in milliseconds)")
    header = ("GPUs", "raw ms", "fake NVML ms", "exporter ms", "generic ms", "bytes")
    print("{:>5} {:>8} {:>13} {:>12} {:>11} {:>8}".format(*header))
    for gpus, scrapes in ((8, 1000), (64, 200)):
        m = measure(gpus, scrapes)
        print(
            f"{gpus:>5} {m['raw']:>8.3f} {m['fake']:>13.3f} {m['own']:>12.3f} "
            f"{m['generic']:>11.3f} {int(m['bytes']):>8}"
        )
    print("raw: render() with the fake NVML; exporter: raw minus the time inside the fake NVML;")
    print("generic: the same scrape through generate_latest (the path before issue 15)")
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this process: {rss_mib:.1f} MiB")
    print("target: <= 1 ms (8 GPUs), <= 8 ms (64 GPUs) per scrape, exporter ms")


if __name__ == "__main__":
    main()
