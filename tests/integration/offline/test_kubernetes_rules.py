"""The Kubernetes policies (rules/kubernetes) pass ``gpuops rules check``: schema, PromQL by
the real promtool, executors. Their policy tests run with the other shipped ones
(test_rules_test.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_the_kubernetes_policies_check() -> None:
    result = CliRunner().invoke(cli, ["rules", "check", str(ROOT / "rules" / "kubernetes")])
    assert result.exit_code == 0, result.output
    assert (
        result.stdout
        == "OK: 6 policies in 1 group from 1 file (schema, PromQL, executors checked)\n"
    )
