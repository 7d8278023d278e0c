"""deploy/prometheus of the compose stack: ``promtool check config`` (rule files included) on a
copy whose container paths point into a temporary directory, and the scrape jobs the policies
and dashboards select on."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuops.sim.fleet.sd import FLEET_JOB, NODES_JOB, prometheus_config, write_targets

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"


def config() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    return doc


def job(name: str) -> dict[str, Any]:
    (found,) = [j for j in config()["scrape_configs"] if j["job_name"] == name]
    return found


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


def test_fleet_jobs_carry_the_names_the_policies_select_on() -> None:
    nodes, fleet = job(NODES_JOB), job(FLEET_JOB)
    assert nodes["honor_labels"] and fleet["honor_labels"]
    assert nodes["file_sd_configs"][0]["files"] == ["/sd/gpu-nodes.json"]
    assert fleet["static_configs"][0]["targets"] == ["fleet:9400"]
    assert job("gpuops-engine")["static_configs"][0]["targets"] == ["engine:9842"]


def test_node_targets_the_fleet_writes_name_the_fleet_service(tmp_path: Path) -> None:
    """``gpuops fleet sim --advertise-host fleet`` writes fleet:<port> targets, readable by
    Prometheus running as another user."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    command = compose["services"]["fleet"]["command"]
    (host,) = [a.split("=", 1)[1] for a in command if a.startswith("--advertise-host=")]
    sd = tmp_path / "gpu-nodes.json"
    write_targets(sd, host, [("node-0", "default", 9401), ("node-1", "default", 9402)])
    targets = [t for group in yaml.safe_load(sd.read_text()) for t in group["targets"]]
    assert targets == ["fleet:9401", "fleet:9402"]
    assert sd.stat().st_mode & 0o777 == 0o644
    assert "relabel_configs" not in job(NODES_JOB)


def test_compose_mounts_match_the_paths_of_the_config() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    prometheus = compose["services"]["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prometheus["volumes"]}
    assert mounts["/etc/prometheus"] == "./deploy/prometheus"
    fleet_volume = mounts["/sd"]
    fleet = compose["services"]["fleet"]
    fleet_mounts = {v.split(":")[0]: v.split(":")[1] for v in fleet["volumes"]}
    sd_arg = next(a for a in fleet["command"] if a.startswith("--sd-file="))
    sd_file = Path(sd_arg.split("=", 1)[1])
    assert fleet_mounts[fleet_volume] == str(sd_file.parent)
    assert job(NODES_JOB)["file_sd_configs"][0]["files"] == [f"/sd/{sd_file.name}"]
    for pattern in config()["rule_files"]:
        relative = pattern.removeprefix("/etc/prometheus/")
        assert list(PROMETHEUS_DIR.glob(relative)), f"no rule file matches {pattern}"


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
