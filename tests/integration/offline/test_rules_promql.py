"""PromQL of policies is checked by the real promtool, its messages mapped to file:line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.model.rules.loader import load_rules, load_rules_text
from gpuops.offline.promtool import check

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "rules"


def test_promtool_errors_name_file_line_and_key() -> None:
    path = FIXTURES / "invalid-promql" / "bad-queries.yaml"
    errors = check(load_rules_text(path.read_text(), path.name))
    expected = path.with_suffix(".expected").read_text().splitlines()
    assert [str(e) for e in errors] == expected


@pytest.mark.parametrize("path", [ROOT / "rules", FIXTURES / "valid"])
def test_valid_policies_have_valid_promql(path: Path) -> None:
    paths = [path] if path.name == "rules" else sorted(path.glob("*.yaml"))
    assert check(load_rules(paths)) == []


def test_rules_check_runs_promtool_and_exits_1() -> None:
    path = FIXTURES / "invalid-promql" / "bad-queries.yaml"
    result = CliRunner().invoke(cli, ["rules", "check", str(path)])
    assert result.exit_code == 1
    expected = path.with_suffix(".expected").read_text().replace("bad-queries.yaml", str(path))
    assert result.stdout == expected
    assert result.stderr == "4 errors in 1 file\n"


def test_rules_check_of_the_shipped_policies_passes() -> None:
    result = CliRunner().invoke(cli, ["rules", "check", str(ROOT / "rules")])
    assert result.exit_code == 0, result.output
    assert (
        result.stdout
        == "OK: 4 policies in 2 groups from 2 files (schema, PromQL, executors checked)\n"
    )
