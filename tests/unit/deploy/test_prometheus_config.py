"""deploy/prometheus of the compose stack: the scrape jobs the policies and dashboards select
on, and the paths the compose file mounts. ``promtool check config`` of it:
tests/integration/deploy/test_prometheus_config.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuops.sim.fleet.sd import FLEET_JOB, NODES_JOB, write_targets

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"


def config() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    return doc


def job(name: str) -> dict[str, Any]:
    (found,) = [j for j in config()["scrape_configs"] if j["job_name"] == name]
    return found


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
