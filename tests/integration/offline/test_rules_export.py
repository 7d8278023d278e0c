"""``gpuops rules export`` writes a rule file that the real ``promtool check rules`` accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sources.promproc import find_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
VALID = ROOT / "tests" / "fixtures" / "rules" / "valid"


@pytest.mark.parametrize(
    ("sources", "alerts"),
    [
        ([ROOT / "rules"], 4),
        ([VALID / "full.yaml", VALID / "minimal.yaml", VALID / "two-files"], 5),
    ],
    ids=["shipped", "fixtures"],
)
def test_exported_rules_pass_promtool(tmp_path: Path, sources: list[Path], alerts: int) -> None:
    out = tmp_path / "alerts.yaml"
    result = CliRunner().invoke(cli, ["rules", "export", *map(str, sources), "-o", str(out)])
    assert result.exit_code == 0, result.output
    proc = subprocess.run(
        [find_binary("promtool"), "check", "rules", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {alerts} rules found" in proc.stdout
    exported = yaml.safe_load(out.read_text())
    full = {r["alert"]: r for g in exported["groups"] for r in g["rules"]}
    if "all-keys" in full:
        assert full["all-keys"]["for"] == "1h30m"
        assert full["all-keys"]["keep_firing_for"] == "500ms"
        assert full["all-keys"]["labels"]["gpuops_policy"] == "all-keys"
        assert full["all-keys"]["labels"]["owner"] == "{{ $labels.node }}"
