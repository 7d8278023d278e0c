"""The what-if's fleet side at full size: 24 virtual hours of the Helios fleet
scaled to 512 GPUs, scraped every 30 virtual seconds and written through a real Prometheus'
remote-write receiver. Prints the wall time, samples per second and where the time goes
(cluster steps, collecting series, encoding and sending). Never fails on noise.

Run: ``python -m tests.benchmarks.bench_virtual_fleet [hours]``. Target of the whole what-if:
24 virtual hours of a 500-GPU fleet in <= 10 minutes on 2 cores, twice (policies off and on).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sim.fleet.remotewrite import RemoteWriter
from gpuops.sim.fleet.virtual import VirtualFleet
from gpuops.sources.promproc import PrometheusServer
from tests.benchmarks.bench_fleet import FLEET, scaled


class _TimedWriter(RemoteWriter):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.spent = 0.0

    def flush(self) -> int:
        started = time.perf_counter()
        try:
            return super().flush()
        finally:
            self.spent += time.perf_counter() - started


def main(hours: float) -> None:
    config = scaled(load_fleet(FLEET), 4)
    with tempfile.TemporaryDirectory(prefix="bench-virtual-") as tmp:
        args = ["--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=30d"]
        prom_cfg = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
        with PrometheusServer(Path(tmp), prom_cfg, extra_args=args) as prom:
            start_ms = (int(time.time()) - int(hours * 3600) - 600) * 1000
            writer = _TimedWriter(prom.url)
            fleet = VirtualFleet(config, start_ms, writer, scrape_interval_s=30.0)
            gpus = sum(len(n.gpus) for n in fleet.cluster.nodes.values())
            started = time.perf_counter()
            for hour in range(1, int(hours) + 1):
                fleet.run_until(hour * 3600.0)
            wall = time.perf_counter() - started
    print(f"fleet: {config.name} x4, {gpus} GPUs; {hours:g} virtual hours, scrape every 30 s")
    print(f"wall: {wall:.1f} s ({hours * 3600 / wall:,.0f}x real time); {fleet.scrapes} scrapes")
    print(
        f"samples written: {writer.samples_sent:,} ({writer.samples_sent / wall:,.0f}/s), "
        f"{writer.bytes_sent / 1e6:.1f} MB snappy"
    )
    print(f"encode + send + Prometheus ingest: {writer.spent:.1f} s; the rest: cluster + collect")
    one = wall * 24 / hours
    print(f"projected 24 h: {one:.0f} s for one run, {2 * one:.0f} s for off and on")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 24.0)
