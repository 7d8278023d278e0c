"""deploy/systemd: every unit's ExecStart is a gpuops command line the real CLI parses (its
commands and options exist: click parses it with ``--help``, which exits before any value is
used), the files the units name are the ones the guide installs, the ports agree with the
engine configuration and the Prometheus configuration. ``systemd-analyze verify`` of each:
tests/integration/deploy/test_systemd_units.py."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.settings import load_config

REPO = Path(__file__).resolve().parents[3]
UNITS = sorted((REPO / "deploy" / "systemd").glob("*.service"))
BINARY = "/opt/gpuops/bin/gpuops"


def unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def exec_start(path: Path) -> list[str]:
    argv = shlex.split(unit(path)["Service"]["ExecStart"])
    assert argv[0] == BINARY, f"{path.name}: ExecStart runs {argv[0]}, not {BINARY}"
    return argv[1:]


def test_the_guide_s_units_are_there() -> None:
    names = {p.name for p in UNITS}
    assert {
        "gpuops-engine.service",
        "gpuops-nvml-exporter.service",
        "gpuops-node-agent.service",
        "gpuops-slurm-exporter.service",
    } <= names


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_exec_start_parses_with_the_real_cli(path: Path) -> None:
    args = exec_start(path)
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, f"{path.name}: gpuops {' '.join(args)}: {result.output}"
    assert result.output.startswith("Usage: "), result.output


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_a_unit_has_the_sections_systemd_needs(path: Path) -> None:
    parsed = unit(path)
    assert parsed["Unit"]["Description"]
    assert parsed["Install"]["WantedBy"] == "multi-user.target"
    assert parsed["Service"]["Restart"] in ("on-failure", "always")


def test_a_broken_exec_start_fails_the_check() -> None:
    result = CliRunner().invoke(cli, ["exporter", "nvml", "--no-such-option", "--help"])
    assert result.exit_code != 0


def test_the_engine_unit_reads_the_shipped_configuration() -> None:
    args = exec_start(REPO / "deploy" / "systemd" / "gpuops-engine.service")
    assert args[args.index("--config") + 1] == "/etc/gpuops/engine.yaml"
    config = load_config(REPO / "deploy" / "systemd" / "engine.yaml")
    assert config.guardrails.dry_run, "the first week runs in dry-run (docs/install.md)"
    assert config.state_file == Path("/var/lib/gpuops/state.sqlite")  # StateDirectory=gpuops
    assert str(config.audit.spool_dir).startswith("/var/lib/gpuops/")
    assert config.executors["gpu-control"]["use"] == "nvml-agent"
    assert config.executors["scheduler"]["use"] == "slurm"


def test_the_ports_agree() -> None:
    """The node agent's port is the one the engine calls and Prometheus scrapes; the engine's
    metrics port is the one Prometheus scrapes."""
    agent = exec_start(REPO / "deploy" / "systemd" / "gpuops-node-agent.service")
    exporter = exec_start(REPO / "deploy" / "systemd" / "gpuops-nvml-exporter.service")
    slurm = exec_start(REPO / "deploy" / "systemd" / "gpuops-slurm-exporter.service")
    port = agent[agent.index("--port") + 1]
    assert exporter[exporter.index("--port") + 1] == port
    assert "--agent" in agent and "--agent" not in exporter
    engine = yaml.safe_load((REPO / "deploy" / "systemd" / "engine.yaml").read_text())
    assert engine["executors"]["nvml-agent"]["url"].endswith(f":{port}")
    token = agent[agent.index("--agent-token-file") + 1]
    assert engine["executors"]["nvml-agent"]["token_file"] == token
    prometheus = (REPO / "deploy" / "prometheus" / "cluster.yml").read_text()
    nodes = (REPO / "deploy" / "prometheus" / "gpu-nodes" / "nodes.yml.example").read_text()
    assert f":{port}" in nodes
    assert f":{slurm[slurm.index('--port') + 1]}" in prometheus
    assert f":{engine['metrics_listen'].rsplit(':', 1)[1]}" in prometheus


def test_the_reboot_drop_in_adds_the_reboot_to_the_agents_own_command_line() -> None:
    """The drop-in restates the unit's ExecStart (a drop-in cannot append to it): the same
    command line, then the reboot's flags, which the real CLI parses; its state directory is
    the one systemd creates for the unit (StateDirectory, writable under ProtectSystem)."""
    path = REPO / "deploy" / "systemd" / "gpuops-node-agent.service"
    drop_in = REPO / "deploy" / "systemd" / "gpuops-node-agent.service.d" / "reboot.conf"
    lines = [
        line.removeprefix("ExecStart=")
        for line in drop_in.read_text().splitlines()
        if line.startswith("ExecStart=")
    ]
    assert lines[0] == "", "a drop-in resets ExecStart before it gives its own"
    (argv,) = [shlex.split(line) for line in lines[1:]]
    assert argv[0] == BINARY
    own = exec_start(path)
    assert argv[1 : len(own) + 1] == own
    added = argv[len(own) + 1 :]
    assert added == ["--agent-reboot", "--agent-state-dir", "/var/lib/gpuops-agent"]
    result = CliRunner().invoke(cli, [*argv[1:], "--help"])
    assert result.exit_code == 0, result.output
    service = unit(path)["Service"]
    assert f"/var/lib/{service['StateDirectory']}" == added[-1]
    assert service["ProtectSystem"] == "strict" and "--agent-reboot" not in own
