"""The shipped off-peak policy (rules/energy) passes its policy tests on a real Prometheus and
its verbs are ones the fleet executor has."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuops.actions.fleet import FleetExecutor
from gpuops.cli import cli

ROOT = Path(__file__).parents[3]


def test_off_peak_policy_tests_pass() -> None:
    files = sorted((ROOT / "rules" / "energy" / "tests").glob("*.yaml"))
    result = CliRunner().invoke(
        cli, ["--log-level", "warning", "rules", "test", *map(str, files)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stdout
    assert result.stdout.count("  PASS  ") == 1


def test_off_peak_policy_checks_and_uses_fleet_verbs() -> None:
    result = CliRunner().invoke(cli, ["rules", "check", str(ROOT / "rules" / "energy")])
    assert result.exit_code == 0, result.output
    text = (ROOT / "rules" / "energy" / "energy.yaml").read_text()
    assert FleetExecutor.verbs is not None
    for verb in ("hold_class", "release_class"):
        assert f"type: {verb}" in text and verb in FleetExecutor.verbs
