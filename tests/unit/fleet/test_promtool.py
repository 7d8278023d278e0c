"""``promtool check metrics`` has nothing to say about a node's or the control port's /metrics."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from gpuops.sim.fleet import FleetSim

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
