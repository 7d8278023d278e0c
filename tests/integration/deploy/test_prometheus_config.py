"""``promtool check config`` (rule files included) passes deploy/prometheus of the compose stack,
on a copy whose container paths point into a temporary directory, and the configuration
``gpuops fleet sim`` writes; it fails a broken one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuops.sim.fleet.sd import FLEET_JOB, NODES_JOB, prometheus_config, write_targets

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"


def promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(path).exists():
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


@pytest.mark.integration
def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """The compose file mounts deploy/prometheus at /etc/prometheus and the fleet's file_sd
    volume at /sd; the copy maps both into tmp_path so promtool finds every file."""
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "prometheus")
    write_targets(tmp_path / "sd" / "gpu-nodes.json", "0.0.0.0", [("node-0", "default", 9401)])
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
    text = text.replace("/etc/prometheus/", f"{tmp_path}/prometheus/").replace(
        "/sd/", f"{tmp_path}/sd/"
    )
    assert str(tmp_path) in text
    path = tmp_path / "prometheus" / "prometheus.yml"
    path.write_text(text)
    result = subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(r"SUCCESS: [1-9]\d* rules found", output), output


@pytest.mark.integration
def test_a_broken_prometheus_config_fails_promtool(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text((PROMETHEUS_DIR / "prometheus.yml").read_text().replace("job_name", "job"))
    result = subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0


@pytest.mark.integration
def test_the_config_fleet_sim_writes_passes_promtool_and_reads_its_sd_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpuops fleet sim --prometheus-config var/prometheus.yml` (README, running the pieces)."""
    monkeypatch.chdir(tmp_path)
    write_targets(Path("var/gpu-nodes.json"), "127.0.0.1", [("node-0", "default", 9401)])
    path = tmp_path / "var" / "prometheus.yml"
    path.write_text(prometheus_config("var/gpu-nodes.json", "127.0.0.1:9400", "15s"))
    result = subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load(path.read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert list(jobs) == [NODES_JOB, FLEET_JOB, "gpuops-engine"]
    assert jobs[NODES_JOB]["file_sd_configs"][0]["files"] == [str(tmp_path / "var/gpu-nodes.json")]
    assert doc["global"]["scrape_interval"] == "15s"
