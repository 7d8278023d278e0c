"""The fleet policies (rules/fleet: power, sharing, lending, consolidation) pass their policy
tests on a real Prometheus and check against the fleet executor's verbs."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli

ROOT = Path(__file__).parents[3]


def test_fleet_policy_tests_pass() -> None:
    files = sorted((ROOT / "rules" / "fleet" / "tests").glob("*.yaml"))
    result = CliRunner().invoke(
        cli, ["--log-level", "warning", "rules", "test", *map(str, files)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stdout
    assert result.stdout.count("  PASS  ") == 13  # power 5, sharing 5, consolidation 3


def test_fleet_policies_check() -> None:
    result = CliRunner().invoke(cli, ["rules", "check", str(ROOT / "rules" / "fleet")])
    assert result.exit_code == 0, result.output
