"""``gpuops health check|xids`` through click."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.cli.api_client import show
from gpuops.cli.health import _NODE_COLUMNS

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "health" / "xid-overrides.yaml"
INVALID = ROOT / "tests" / "fixtures" / "health" / "invalid-overrides.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["health", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_check_valid_overrides_exits_0() -> None:
    code, out, _ = run("check", str(EXAMPLE))
    assert code == 0
    assert out.startswith("OK: 1 override file over the 98 codes of NVIDIA Xid Errors")


def test_check_invalid_overrides_prints_file_line_and_exits_1() -> None:
    code, out, err = run("check", str(INVALID))
    assert code == 1
    expected = INVALID.with_suffix(".expected").read_text()
    assert out == expected.replace("tests/fixtures/health/invalid-overrides.yaml", str(INVALID))
    assert err == "12 errors\n"


def test_check_reads_the_engine_configuration(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text("xids:\n  - code: 45\n    action: reboot\n")
    config = tmp_path / "engine.yaml"
    config.write_text("health:\n  xid_overrides: [site.yaml]\n")
    code, _, err = run("check", "--config", str(config))
    assert code == 1
    assert err == (
        f'Error: {tmp_path / "site.yaml"}:3: xids[0].action: unknown action "reboot", did you '
        'mean "reboot_node"? (allowed: none, restart_job, reset_gpu, reboot_node, replace)\n'
    )
    (tmp_path / "site.yaml").write_text("xids:\n  - code: 45\n    action: reboot_node\n")
    code, out, _ = run("check", "--config", str(config))
    assert code == 0 and out.startswith("OK: 1 override file")


def test_check_without_files_is_a_usage_error() -> None:
    code, _, err = run("check")
    assert code == 2
    assert "give XID override files, or --config ENGINE_YAML" in err


def test_xids_prints_the_catalogue_in_force() -> None:
    code, out, err = run("xids", "--json", str(EXAMPLE))
    assert code == 0
    rows = {row["code"]: row for row in map(json.loads, out.splitlines())}
    assert rows[45]["threshold"] == {"count": 30, "window_s": 600.0}
    assert rows[119]["action"] == "reboot_node"
    assert rows[79] == {
        "code": 79,
        "mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "class": "hardware",
        "action": "reboot_node",
        "threshold": {"count": 1, "window_s": 3600.0},
        "cancels": [],
        "nvidia": "RESTART_BM",
    }
    code, out, err = run("xids")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "8",
        "application",
        "restart_job",
        "5",
        "in",
        "1h",
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
    ]
    assert err.endswith("; no overrides\n")


def test_nodes_lists_each_nodes_failure_domains(capsys: pytest.CaptureFixture[str]) -> None:
    row = {
        "node": "gpu-7",
        "stage": "quarantined",
        "since": 1_700_000_000.0,
        "gpu": "GPU-1",
        "domains": ["pool=a100", "rack=r12"],
        "fault": "XID 79",
        "done": [],
        "why": "deferred: paced repair in rack=r12: 1 unproven repair(s) at width 1",
    }
    show([row], False, [row, {**row, "node": "gpu-8", "domains": []}], _NODE_COLUMNS)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["NODE", "STAGE", "SINCE", "GPU", "DOMAINS"]
    start = lines[0].index("DOMAINS")
    assert lines[1][start:].startswith("pool=a100, rack=r12 ")
    assert lines[2][start:].startswith("- ")
