"""The simulated fleet's /metrics as Prometheus scrapes them: ``promtool check metrics`` has
nothing to say about a node's or the control port's, and the control port's carry the price,
energy and power series."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from gpuops.sim.fleet import FleetSim
from tests.unit.sim.fleet.test_energy import VALLEY, quiet

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")
@pytest.mark.parametrize("target", ["node", "control"])
def test_promtool_finds_nothing(fleet: FleetSim, target: str) -> None:
    url = fleet.node_url("node-0") if target == "node" else f"{fleet.control_url}/metrics"
    text = requests.get(url, timeout=5).text
    assert "nvml_gpu_utilization_ratio" in text or "gpuops_gpu_allocated" in text
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_fleet_metrics_carry_price_energy_and_power(tmp_path: object) -> None:
    config = quiet(tariff=VALLEY, start_hour=19.0, sd_file=f"{tmp_path}/sd.json")
    with FleetSim(config) as sim:
        sim.cluster.advance(60.0)
        text = requests.get(f"{sim.control_url}/metrics", timeout=5).text
    assert 'gpuops_electricity_price_per_kwh{currency="USD",period="peak"} 1.12' in text
    assert 'gpuops_electricity_off_peak_price_per_kwh{currency="USD"} 0.32' in text
    assert 'gpuops_fleet_energy_joules_total{pool="default"}' in text
    assert 'gpuops_fleet_power_watts{pool="default"} 880.0' in text  # 16 idle A100 at 55 W
