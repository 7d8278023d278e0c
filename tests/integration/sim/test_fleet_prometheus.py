"""A real Prometheus scrapes the simulated fleet through file_sd: series, queue, a failed node
as up == 0, and a scaled-out node's new target."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuops.sim.fleet import FleetConfig, FleetSim
from gpuops.sources.promproc import PrometheusServer
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetSim, PrometheusServer]]:
    workdir: Path = tmp_path_factory.mktemp("fleet-prom")
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=str(workdir / "gpu-nodes.json"))
    with FleetSim(config) as fleet:
        prom_config = "global:\n  scrape_interval: 1s\n" + fleet.scrape_config("1s")
        with PrometheusServer(workdir / "prom", prom_config) as prom:
            yield fleet, prom


def query(prom: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    r = requests.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def test_gpu_series_carry_node_uuid_and_gpu(stack: tuple[FleetSim, PrometheusServer]) -> None:
    _, prom = stack
    series = wait_for(lambda: len(query(prom, "nvml_gpu_utilization_ratio")) == 16 and
                      query(prom, "nvml_gpu_utilization_ratio"))  # fmt: skip
    for s in series:
        labels = s["metric"]
        assert labels["job"] == "gpu-nodes"
        assert labels["node"].startswith("node-") and labels["pool"] == "default"
        assert labels["uuid"].startswith("GPU-") and labels["gpu"] in {"0", "1", "2", "3"}


def test_fleet_series_are_scraped(stack: tuple[FleetSim, PrometheusServer]) -> None:
    _, prom = stack
    queue = wait_for(lambda: query(prom, "gpuops_queue_pending_jobs"))
    assert queue[0]["metric"]["pool"] == "default" and queue[0]["value"][1] == "0"
    idle = wait_for(
        lambda: query(
            prom, "nvml_gpu_utilization_ratio < 0.1 and on (uuid) gpuops_gpu_allocated == 1"
        )
    )
    assert {s["metric"]["node"] for s in idle} == {"node-3"}


def test_failed_node_is_down_and_restored_node_is_up(
    stack: tuple[FleetSim, PrometheusServer],
) -> None:
    fleet, prom = stack
    wait_for(lambda: query(prom, 'up{job="gpu-nodes",node="node-2"} == 1'))
    requests.post(f"{fleet.control_url}/api/v1/nodes/node-2/fail", timeout=5).raise_for_status()
    down = wait_for(lambda: query(prom, 'up{job="gpu-nodes"} == 0'))
    assert [s["metric"]["node"] for s in down] == ["node-2"]
    requests.post(f"{fleet.control_url}/api/v1/nodes/node-2/restore", timeout=5).raise_for_status()
    wait_for(lambda: query(prom, 'up{job="gpu-nodes",node="node-2"} == 1'))


def test_scaled_out_node_becomes_a_target(stack: tuple[FleetSim, PrometheusServer]) -> None:
    fleet, prom = stack
    r = requests.post(
        f"{fleet.control_url}/api/v1/pools/default/scale_out", json={"nodes": 1}, timeout=5
    )
    (added,) = r.json()["changed"]["added"]
    wait_for(lambda: query(prom, f'up{{job="gpu-nodes",node="{added}"}} == 1'))
    wait_for(lambda: query(prom, f'nvml_gpu_up{{node="{added}"}}'))
