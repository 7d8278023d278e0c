"""Policy test files: promtool's values notation and the file's errors with file:line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuops.model.rules.model import RulesError
from gpuops.model.rules.testspec import STALE, ValuesError, expand_values, parse_test_file
from gpuops.offline.policytest import _bases, run_test_file

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("-2+4x3", [-2.0, 2.0, 6.0, 10.0]),
        (" 1-2x4", [1.0, -1.0, -3.0, -5.0, -7.0]),
        ("1x4", [1.0] * 5),
        ("1 _x3 stale", [1.0, None, None, None, STALE]),
        ("0.1+0x2", [0.1, 0.1, 0.1]),
        ("1x2 _ 3", [1.0, 1.0, 1.0, None, 3.0]),
        ("1e3 .5 +Inf -Inf", [1000.0, 0.5, math.inf, -math.inf]),
    ],
)
def test_expand_values_like_promtool(text: str, values: list[object]) -> None:
    assert expand_values(text) == values


def test_nan_values_are_kept() -> None:
    (value,) = expand_values("NaN")
    assert isinstance(value, float) and math.isnan(value)


@pytest.mark.parametrize("text", ["", "1x", "x3", "1+x3", "one", "1,2", "_x", "stale2"])
def test_expand_values_rejects(text: str) -> None:
    with pytest.raises(ValuesError):
        expand_values(text)


def errors_of(text: str) -> list[str]:
    with pytest.raises(RulesError) as caught:
        parse_test_file(text, "t.yaml")
    return [str(e) for e in caught.value.errors]


def test_test_file_errors_name_file_line_and_key() -> None:
    text = (
        "rule_files: [rules.yaml]\n"
        "evaluation_interval: 15 s\n"
        "tests:\n"
        "  - name: one\n"
        "    input_series:\n"
        "      - serie: up\n"
        "        values: 1x3\n"
        "    expected_decisions:\n"
        "      - {at: 2m, policy: p, transition: fired}\n"
    )
    assert errors_of(text) == [
        't.yaml:2: evaluation_interval: invalid duration "15 s" (expected a Prometheus duration '
        "such as 30s, 5m, 1h)",
        't.yaml:6: tests[0].input_series[0]: missing required key "series"',
        't.yaml:6: tests[0].input_series[0]: unknown key "serie", did you mean "series"? '
        "(allowed: series, values)",
        't.yaml:9: tests[0].expected_decisions[0].transition: invalid value "fired", did you '
        'mean "fire"? (allowed: fire, clear, resolve)',
    ]


def test_an_empty_test_file_is_an_error() -> None:
    assert errors_of("") == ["t.yaml:1: file is empty (expected rule_files and tests)"]


def test_unknown_policies_in_a_test_are_errors_before_anything_runs(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        f"rule_files: [{ROOT / 'rules' / 'capacity.yaml'}]\n"
        "tests:\n"
        "  - name: one\n"
        "    policies: [scale-out]\n"
        "    expected_decisions:\n"
        "      - {at: 2m, policy: scale-out-on-queue, transition: fire}\n"
        "      - {at: 3m, policy: migrate, transition: fire}\n"
    )
    with pytest.raises(RulesError) as caught:
        run_test_file(path)
    known = "known: migrate-off-down-nodes, scale-out-on-queue"
    assert [str(e) for e in caught.value.errors] == [
        f"{path}:3: tests[0].policies: unknown policy 'scale-out' ({known})",
        f"{path}:7: tests[0].expected_decisions[1].policy: unknown policy 'migrate' ({known})",
    ]


def test_rule_files_are_relative_to_the_test_file(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("rule_files: [missing.yaml]\ntests:\n  - name: one\n")
    with pytest.raises(RulesError) as caught:
        run_test_file(path)
    assert [str(e) for e in caught.value.errors] == [
        f"{tmp_path / 'missing.yaml'}:0: cannot read: no such file or directory"
    ]


def test_no_policy_test_starts_at_a_utc_midnight() -> None:
    """VictoriaMetrics' instant query at exactly 00:00 UTC does not find a series that starts
    then (its per-day index): a test whose start the clock put there decided 15 s late on it
    and failed only between 02:00 and 03:00 UTC. The starts stay whole hours before now."""
    midnight = 20_000 * 86400
    span = 915 + 86400
    now = midnight + 3 * span + 3600 + 100  # the whole hour before the tests is a midnight
    bases = _bases(now, span, 3)
    assert bases[0] == midnight - 3600 and all(b % 86400 for b in bases)
    assert bases[-1] + span <= now
    assert _bases(now + 3600, span, 3)[0] == midnight + 3600  # no shift needed
    for count in (1, 5, 47):  # whole-day spans put every test at the same hour of the day
        same = _bases(midnight + count * 86400 + 3600, 86400, count)
        assert all(b % 86400 for b in same) and same[-1] + 86400 <= midnight + count * 86400 + 3600
