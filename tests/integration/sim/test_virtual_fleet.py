"""The fleet in virtual time: hours of the case-study fleet written through a real
Prometheus' remote-write receiver in seconds, and PromQL at virtual instants sees what the
cluster held then (values, labels, vanished series marked stale)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sim.fleet.remotewrite import RemoteWriteError, RemoteWriter
from gpuops.sim.fleet.virtual import VirtualFleet
from gpuops.sources.promproc import PrometheusServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
HOURS = 3


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("virtual-prom")
    config = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
    args = ["--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=30d"]
    with PrometheusServer(workdir, config, extra_args=args) as prom:
        yield prom.url


def query(url: str, expr: str, at_ms: int) -> list[dict[str, object]]:
    resp = requests.get(
        f"{url}/api/v1/query", params={"query": expr, "time": at_ms / 1000}, timeout=10
    )
    resp.raise_for_status()
    result: list[dict[str, object]] = resp.json()["data"]["result"]
    return result


def scalar(url: str, expr: str, at_ms: int) -> float:
    result = query(url, expr, at_ms)
    assert len(result) == 1, (expr, result)
    value = result[0]["value"]
    assert isinstance(value, list)
    return float(value[1])


def test_hours_of_fleet_in_seconds_and_promql_sees_them(prom_url: str) -> None:
    start_ms = (int(time.time()) - HOURS * 3600 - 600) * 1000
    writer = RemoteWriter(prom_url)
    fleet = VirtualFleet(
        load_fleet(REPO / "examples" / "fleets" / "case-study.yaml"),
        start_ms,
        writer,
        scrape_interval_s=30.0,
    )
    started = time.monotonic()
    checkpoints: list[tuple[int, int, float, float]] = []
    for hour in range(1, HOURS + 1):
        fleet.run_until(hour * 3600.0)
        c = fleet.cluster
        allocated = sum(g.job is not None for n in c.nodes.values() for g in n.gpus)
        up = [n for n in c.nodes.values() if not n.failed]
        power = sum(n.host_power + sum(g.power for g in n.gpus) for n in up)  # hosts too
        checkpoints.append((fleet.timestamp_ms(c.time), allocated, power, c.price_per_kwh()))
    wall = time.monotonic() - started
    assert wall < HOURS * 20, f"{HOURS} virtual hours took {wall:.0f} s"
    assert writer.samples_sent > 100_000
    gpus = sum(len(n.gpus) for n in fleet.cluster.nodes.values())
    for at_ms, allocated, power, price in checkpoints:
        # every GPU has exactly one allocation series: finished jobs' series are stale
        assert scalar(prom_url, "count(gpuops_gpu_allocated)", at_ms) == gpus
        assert scalar(prom_url, "sum(gpuops_gpu_allocated)", at_ms) == allocated
        assert scalar(prom_url, "sum(gpuops_fleet_power_watts)", at_ms) == pytest.approx(power)
        assert scalar(prom_url, "max(gpuops_electricity_price_per_kwh)", at_ms) == price
        assert scalar(prom_url, 'count(up{job="gpu-nodes"} == 1)', at_ms) == len(
            fleet.cluster.nodes
        )
    last = checkpoints[-1][0]
    over = scalar(prom_url, "avg(avg_over_time(nvml_gpu_utilization_ratio[1h]))", last)
    assert 0.0 < over < 1.0
    rows = query(prom_url, 'nvml_gpu_utilization_ratio{pool="a100"}', last)
    assert {r["metric"]["job"] for r in rows} == {"gpu-nodes"}  # type: ignore[index]


def test_a_refused_write_is_an_error_naming_the_endpoint(prom_url: str) -> None:
    writer = RemoteWriter(prom_url)
    writer.add(1_000, {(("__name__", "x"), ("a", "b")): 1.0})
    writer.add(500, {(("__name__", "x"), ("a", "b")): 2.0})  # out of order: Prometheus refuses
    with pytest.raises(RemoteWriteError, match=r"/api/v1/write: 400"):
        writer.flush()
