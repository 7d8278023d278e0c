"""``gpuops rules test``: policy unit tests evaluated by a real Prometheus pass for the shipped
policies and fail, with a diff, when an expectation is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def run(*files: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--log-level", "warning", "rules", "test", *map(str, files)], catch_exceptions=False
    )
    return result.exit_code, result.stdout


@pytest.mark.parametrize(
    ("folder", "files", "cases"),
    [
        ("rules/tests", 2, 8),
        ("rules/slurm/tests", 1, 3),
        ("rules/demo/tests", 1, 2),
        ("rules/kubernetes/tests", 1, 8),
        ("rules/health/tests", 1, 3),
    ],
)
def test_the_shipped_policy_tests_pass(folder: str, files: int, cases: int) -> None:
    found = sorted((ROOT / folder).glob("*.yaml"))
    assert len(found) == files
    code, out = run(*found)
    assert code == 0, out
    assert out.count("  PASS  ") == cases
    assert "FAIL" not in out


WRONG = """
rule_files: [{rules}]
evaluation_interval: 15s
tests:
  - name: expects the scale-out 15 seconds too early and misses the clear
    interval: 15s
    policies: [scale-out-on-queue]
    input_series:
      - series: 'gpuops_queue_pending_jobs{{pool="a100"}}'
        values: '12x12 0x4'
    expected_decisions:
      - {{at: 1m45s, policy: scale-out-on-queue, transition: fire, target: {{pool: a100}}}}
    no_decisions:
      - {{from: 0s, to: 2m}}
"""


def test_a_wrong_expectation_fails_with_a_diff(tmp_path: Path) -> None:
    test_file = tmp_path / "wrong.test.yaml"
    test_file.write_text(WRONG.format(rules=ROOT / "rules" / "capacity.yaml"))
    code, out = run(test_file)
    assert code == 1
    assert out == (
        f"{test_file}\n"
        "  FAIL  expects the scale-out 15 seconds too early and misses the clear\n"
        "        decisions differ (- expected, + got):\n"
        '        - at 1m45s    fire    scale-out-on-queue {pool="a100"}\n'
        '        + at 2m       fire    scale-out-on-queue {pool="a100"}\n'
        '        + at 3m15s    clear   scale-out-on-queue {pool="a100"}\n'
        "        decision in no_decisions window 0s..2m: at 2m       fire    "
        'scale-out-on-queue {pool="a100"}\n'
    )


MISSING_AND_STALE = """
rule_files: [{rules}]
evaluation_interval: 15s
lookback_delta: 20s
tests:
  - name: a gap keeps the node down, a stale marker ends it
    interval: 15s
    policies: [migrate-off-down-nodes]
    input_series:
      - series: 'up{{job="gpu-nodes",node="gpu-node-1"}}'
        values: '0x4 _ 0x4 stale'
      - series: 'up{{job="gpu-nodes",node="gpu-node-2"}}'
        values: '0x4 _x3 0x4'
    expected_decisions:
      - {{at: 30s, policy: migrate-off-down-nodes, transition: fire, target: {{node: gpu-node-1}}}}
      - {{at: 30s, policy: migrate-off-down-nodes, transition: fire, target: {{node: gpu-node-2}}}}
      - {{at: 1m30s, policy: migrate-off-down-nodes, transition: clear,
          target: {{node: gpu-node-2}}}}
      - {{at: 2m30s, policy: migrate-off-down-nodes, transition: fire,
          target: {{node: gpu-node-2}}}}
      - {{at: 3m, policy: migrate-off-down-nodes, transition: clear, target: {{node: gpu-node-1}}}}
"""


def test_missing_samples_and_stale_follow_the_lookback_delta(tmp_path: Path) -> None:
    # lookback_delta 20s: one missing 15s sample (`_`) is bridged, three are not (gpu-node-2
    # clears at 1m30s and comes back at 2m); after `stale` (gpu-node-1's last sample is at
    # 2m30s) the node leaves the result once that sample is more than 20s old.
    test_file = tmp_path / "gaps.test.yaml"
    test_file.write_text(MISSING_AND_STALE.format(rules=ROOT / "rules" / "capacity.yaml"))
    code, out = run(test_file)
    assert code == 0, out


def test_an_invalid_test_file_is_reported_with_file_and_line(tmp_path: Path) -> None:
    test_file = tmp_path / "bad.test.yaml"
    test_file.write_text(
        f"rule_files: [{ROOT / 'rules' / 'capacity.yaml'}]\n"
        "tests:\n"
        "  - name: typo\n"
        "    input_series:\n"
        "      - series: 'up'\n"
        "        values: '1x3 oops'\n"
    )
    code, out = run(test_file)
    assert code == 1
    assert out == (
        f"{test_file}\n"
        f"  {test_file}:6: tests[0].input_series[0].values: invalid values token 'oops' "
        "(expected promtool notation such as '0.1+0x30', '1x10 _x5 stale', '-2+4x3')\n"
    )
