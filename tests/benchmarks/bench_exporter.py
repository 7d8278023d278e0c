"""Exporter scrape cost (DESIGN.md section 12, issue 6): the exporter's own CPU time per scrape
for 8 and 64 fake GPUs, and the process RSS. Prints figures; never fails on noise.

Run: ``python -m tests.benchmarks.bench_exporter`` or ``python tests/benchmarks/bench_exporter.py``.
The fake NVML answers instantly, so NVML latency is excluded; the time its Python methods take
is measured on a second, wrapped instance and subtracted; the raw figure is printed too.
Target: <= 2 ms per scrape for 8 GPUs (collect and render the text format).
"""

from __future__ import annotations

import resource
import time
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from exporters.nvml.collector import NvmlCollector
from exporters.nvml.scenarios import healthy_h100
from exporters.nvml.session import NvmlSession


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
    """CPU milliseconds per scrape: raw, inside the fake NVML, collect only, and exporter's own."""
    registry, collector = _registry(healthy_h100(gpus))
    raw = _cpu_ms(lambda: generate_latest(registry), scrapes)
    collect = _cpu_ms(lambda: list(collector.collect()), scrapes)
    timed = _Timed(healthy_h100(gpus))  # a second exporter, only to time the fake's methods
    timed_registry, _ = _registry(timed)
    timed.spent = 0.0
    _cpu_ms(lambda: generate_latest(timed_registry), scrapes)
    fake = timed.spent / scrapes * 1000
    return {
        "raw": raw,
        "fake": fake,
        "collect": collect - fake,
        "own": raw - fake,
        "bytes": float(len(generate_latest(registry))),
    }


def main() -> None:
    print("NVML exporter scrape cost (fake NVML, CPU time per scrape in milliseconds)")
    header = ("GPUs", "raw ms", "fake NVML ms", "collect ms", "exporter ms", "bytes")
    print("{:>5} {:>8} {:>13} {:>11} {:>12} {:>8}".format(*header))
    for gpus, scrapes in ((8, 500), (64, 100)):
        m = measure(gpus, scrapes)
        print(
            f"{gpus:>5} {m['raw']:>8.3f} {m['fake']:>13.3f} {m['collect']:>11.3f} "
            f"{m['own']:>12.3f} {int(m['bytes']):>8}"
        )
    print("raw: collect + text exposition; exporter: raw minus the time inside the fake NVML;")
    print("collect: the collector alone, without prometheus_client's text rendering")
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this process: {rss_mib:.1f} MiB")
    print("target: <= 2 ms per scrape for 8 GPUs (exporter ms, NVML latency excluded)")


if __name__ == "__main__":
    main()
