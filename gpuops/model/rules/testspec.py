"""Policy unit-test files (``gpuops rules test``): their schema and promtool's ``values`` notation.

A test file names rule files, input series and the decisions expected at given times, in the
spirit of ``promtool test rules``. This module only reads and validates (errors name file, line
and key, like rule files); ``gpuops.offline.policytest`` runs the tests against a real Prometheus.

    rule_files: [../capacity.yaml]        # relative to the test file
    evaluation_interval: 15s              # how often every policy is evaluated (default 1m)
    lookback_delta: 5m                    # Prometheus --query.lookback-delta (default 5m)
    tests:
      - name: a long queue scales out
        interval: 15s                     # spacing of input samples (default evaluation_interval)
        policies: [scale-out-on-queue]    # evaluated policies (default: all with an expr)
        input_series:
          - series: 'gpuops_queue_pending_jobs{pool="a100"}'
            values: '12x20 2x4'           # promtool notation: a+bxn, axn, _, _xn, stale
        expected_decisions:               # exactly the decisions made (none: empty list)
          - {at: 2m, policy: scale-out-on-queue, transition: fire, target: {pool: a100}}
        no_decisions:                     # windows without any decision (of one policy)
          - {from: 0s, to: 1m45s}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gpuops.model.rules.messages import from_validation, from_yaml
from gpuops.model.rules.model import RuleError, RulesError
from gpuops.model.rules.schema import (
    Duration,
    LabelName,
    NonEmpty,
    PositiveDuration,
    Text,
    choice,
    describe,
    fail,
)
from gpuops.model.rules.yamlsource import parse_yaml

MISSING = None
"""A sample that was not scraped (``_``)."""
STALE = "stale"
"""The series ends here (``stale``)."""

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?Inf|NaN"
_EXPANDING = re.compile(rf"(?P<a>{_NUMBER})(?:(?P<op>[-+])(?P<b>{_NUMBER}))?x(?P<n>\d+)")
_PLAIN = re.compile(_NUMBER)
_BLANKS = re.compile(r"_x(?P<n>\d+)")

Value = float | str | None


class ValuesError(ValueError):
    """A ``values`` string that is not promtool's notation."""


def expand_values(text: str) -> list[Value]:
    """promtool's notation to one value per input interval: a float, ``None`` (``_``, missing)
    or ``"stale"``. ``'1+2x3'`` → 1 3 5 7; ``'1x2'`` → 1 1 1; ``'_x2 stale'`` → _ _ stale."""
    out: list[Value] = []
    for token in text.split():
        if token == "_":
            out.append(MISSING)
        elif token == STALE:
            out.append(STALE)
        elif blanks := _BLANKS.fullmatch(token):
            out.extend([MISSING] * int(blanks.group("n")))
        elif _PLAIN.fullmatch(token):
            out.append(float(token))
        elif match := _EXPANDING.fullmatch(token):
            start = float(match.group("a"))
            step = float(match.group("b") or 0) * (-1 if match.group("op") == "-" else 1)
            out.extend(start + i * step for i in range(int(match.group("n")) + 1))
        else:
            raise ValuesError(
                f"invalid values token {token!r} (expected promtool notation such as "
                "'0.1+0x30', '1x10 _x5 stale', '-2+4x3')"
            )
    if not out:
        raise ValuesError("values must not be empty (expected promtool notation such as '1x10')")
    return out


def _values(value: Any) -> list[Value]:
    if not isinstance(value, str):
        raise fail("values", f"expected a string of promtool values, found {describe(value)}")
    try:
        return expand_values(value)
    except ValuesError as exc:
        raise fail("values", str(exc)) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeriesModel(_Strict):
    series: NonEmpty
    """A series in exposition syntax: ``metric{label="value"}``."""
    values: Annotated[list[float | str | None], BeforeValidator(_values)]


class ExpectedDecisionModel(_Strict):
    at: Duration
    policy: NonEmpty
    transition: Annotated[str, BeforeValidator(choice("fire", "clear", "resolve"))]
    target: dict[LabelName, Text] = Field(default_factory=dict)


class WindowModel(_Strict):
    start: Duration = Field(alias="from")
    end: Duration = Field(alias="to")
    policy: NonEmpty | None = None


class CaseModel(_Strict):
    name: NonEmpty
    interval: PositiveDuration | None = None
    policies: list[NonEmpty] | None = None
    input_series: list[SeriesModel] = Field(default_factory=list)
    expected_decisions: list[ExpectedDecisionModel] = Field(default_factory=list)
    no_decisions: list[WindowModel] = Field(default_factory=list)


class TestFileModel(_Strict):
    rule_files: list[NonEmpty] = Field(min_length=1)
    evaluation_interval: PositiveDuration = 60.0
    lookback_delta: PositiveDuration = 300.0
    tests: list[CaseModel] = Field(min_length=1)


_NESTED: Mapping[str, type[BaseModel]] = MappingProxyType(
    {
        "tests": CaseModel,
        "input_series": SeriesModel,
        "expected_decisions": ExpectedDecisionModel,
        "no_decisions": WindowModel,
    }
)


@dataclass(frozen=True)
class TestFile:
    """A validated test file and where its parts are (for messages)."""

    model: TestFileModel
    file: str
    lines: dict[str, int]
    """``tests[0]``, ``tests[0].input_series[1]``, ``tests[0].expected_decisions[0]`` → line."""


def parse_test_file(text: str, filename: str) -> TestFile:
    """Validate a test file; raises ``RulesError`` with every problem found."""
    data, positions, problems = parse_yaml(text)
    errors = [from_yaml(filename, p) for p in problems]
    if data is None and not errors:
        errors.append(RuleError(filename, 1, "file is empty (expected rule_files and tests)"))
    if errors:
        raise RulesError(errors)
    try:
        model = TestFileModel.model_validate(data)
    except ValidationError as exc:
        raise RulesError(
            from_validation(filename, (), exc, TestFileModel, positions, _NESTED)
        ) from None
    lines: dict[str, int] = {}
    for index, case in enumerate(model.tests):
        lines[f"tests[{index}]"] = positions.value_line(("tests", index))
        for key in ("input_series", "expected_decisions", "no_decisions"):
            for item in range(len(getattr(case, key))):
                lines[f"tests[{index}].{key}[{item}]"] = positions.value_line(
                    ("tests", index, key, item)
                )
    return TestFile(model, filename, lines)
