"""Runs policy unit tests (``gpuops rules test``) with PromQL evaluated by a real Prometheus.

Called by ``gpuops.cli.rules``. Per test file: the input series of every test are written as
OpenMetrics text (each test in its own day, so that range selectors never see another test's
data), turned into TSDB blocks by ``promtool tsdb create-blocks-from openmetrics``, and served
by a real Prometheus (``gpuops.sources.promproc``). Each policy is then queried at every evaluation
step
(``/api/v1/query?time=``) and the results go through the pure ``gpuops.model.evaluation.evaluate``,
exactly as the live loop does. The decisions made are compared with the expected ones: they
are the evaluation's decisions, before the guardrails (mode, cooldown, limits, approval) judge
them, so a test says what the policy decides, not what a given engine state lets through.
Every policy with an ``expr`` is evaluated at each ``evaluation_interval`` step (``schedule``
and Alertmanager triggers are the runtime's business and are not simulated).

OpenMetrics cannot carry Prometheus' staleness marker: ``stale`` ends a series, and its last
value stays visible for the lookback delta (set ``lookback_delta`` in the test file to shorten).
"""

from __future__ import annotations

import difflib
import logging
import math
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuops.model.decisions import Decision, Sample
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.evaluation.step import QueryResult
from gpuops.model.rules.durations import format_duration
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import Policy, RuleError, RulesError, RuleSet
from gpuops.model.rules.testspec import STALE, CaseModel, TestFile, Value, parse_test_file
from gpuops.sources.promproc import (
    ProcessError,
    PrometheusServer,
    VictoriaMetricsServer,
    find_binary,
)

log = logging.getLogger(__name__)

DAY = 86400
Echo = Callable[[str], None]


class PolicyTestError(RuntimeError):
    """The test could not run: no promtool/prometheus, bad input series, a failed query."""


@dataclass(frozen=True, order=True)
class Seen:
    """A decision as the tests compare it: relative time, policy, transition, target labels."""

    at: float
    policy: str
    transition: str
    target: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        labels = ",".join(f'{k}="{v}"' for k, v in self.target)
        return f"at {format_duration(self.at):<8} {self.transition:<7} {self.policy} {{{labels}}}"


@dataclass(frozen=True)
class CaseResult:
    name: str
    problems: tuple[str, ...]
    decisions: tuple[Seen, ...] = ()
    """Every decision made, in order."""

    @property
    def ok(self) -> bool:
        return not self.problems


def run_test_files(files: list[Path], echo: Echo, start_timeout: float = 60.0) -> bool:
    """Run every test of ``files``; print PASS/FAIL per test and a diff per failure."""
    ok = True
    for path in files:
        echo(str(path))
        try:
            results = run_test_file(path, start_timeout)
        except RulesError as exc:
            for error in exc.errors:
                echo(f"  {error}")
            ok = False
            continue
        except (PolicyTestError, ProcessError) as exc:
            echo(f"  ERROR {exc}")
            ok = False
            continue
        for result in results:
            echo(f"  {'PASS' if result.ok else 'FAIL'}  {result.name}")
            for line in result.problems:
                echo(f"        {line}")
            ok = ok and result.ok
    return ok


BACKENDS = ("prometheus", "victoriametrics")


def run_test_file(
    path: Path, start_timeout: float = 60.0, backend: str = "prometheus"
) -> list[CaseResult]:
    """The results of the tests in ``path``; raises ``RulesError`` for an invalid file.
    ``backend``: which server evaluates the PromQL — a real Prometheus (blocks made by
    promtool), or a single-node VictoriaMetrics (MetricsQL; the series imported through
    ``/api/v1/import/prometheus``, the lookback delta as ``-search.maxStalenessInterval``)."""
    if backend not in BACKENDS:
        raise PolicyTestError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    spec = parse_test_file(path.read_text(encoding="utf-8"), str(path))
    model = spec.model
    ruleset = load_rules([path.parent / name for name in model.rule_files])
    _check_names(spec, ruleset)
    span = max(_end(case, model.evaluation_interval) for case in model.tests) + DAY
    bases = _bases(time.time(), span, len(model.tests))
    with tempfile.TemporaryDirectory(prefix="gpuops-rules-test-") as tmp:
        workdir = Path(tmp)
        lines = []
        for index, (case, base) in enumerate(zip(model.tests, bases, strict=True)):
            lines.extend(_openmetrics(spec, index, case, base, model.evaluation_interval))
        lookback = format_duration(model.lookback_delta)
        server: PrometheusServer | VictoriaMetricsServer
        if backend == "victoriametrics":
            server = VictoriaMetricsServer(
                workdir, extra_args=[f"-search.maxStalenessInterval={lookback}"]
            )
            server.start(timeout=start_timeout)
            try:
                server.import_text("".join(f"{_millis(line)}\n" for line in lines))
            except requests.RequestException as exc:
                server.stop()
                raise PolicyTestError(f"importing the input series failed: {exc}") from exc
        else:
            _create_blocks(workdir, lines)
            server = PrometheusServer(
                workdir,
                "global: {}\n",
                extra_args=[
                    "--storage.tsdb.retention.time=10y",
                    f"--query.lookback-delta={lookback}",
                ],
            )
            server.start(timeout=start_timeout)
        try:
            return [
                _run_case(server.url, ruleset, case, base, model.evaluation_interval)
                for case, base in zip(model.tests, bases, strict=True)
            ]
        finally:
            server.stop()


def _bases(now: float, span: float, count: int) -> list[int]:
    """The start (unix seconds) of each of ``count`` tests ``span`` apart, ending an hour
    before ``now``: whole hours from the first where it can be, and none at a UTC midnight.
    VictoriaMetrics keeps an index of the series per UTC day, and an instant query at exactly
    00:00 does not find a series whose first sample is at that instant (one evaluation later
    than on Prometheus: a test that passed or failed by the hour it ran)."""
    latest = int((now - span * count - 3600) // 3600 * 3600)
    # Each base is at midnight for at most one of 24 whole-hour shifts, and for at most one
    # of the half-hour ones after them: with fewer than 48 tests one of these has none.
    shifts = [h * 3600 for h in range(24)] + [h * 3600 + 1800 for h in range(24)]
    for shift in shifts:
        bases = [latest - shift + i * int(span) for i in range(count)]
        if all(base % 86400 for base in bases):
            return bases
    return bases


def _check_names(spec: TestFile, ruleset: RuleSet) -> None:
    known = {p.name for p in ruleset.policies()}
    errors = []
    for index, case in enumerate(spec.model.tests):
        named = [(f"tests[{index}]", "policies", n) for n in case.policies or []]
        named += [
            (f"tests[{index}].expected_decisions[{i}]", "policy", d.policy)
            for i, d in enumerate(case.expected_decisions)
        ]
        named += [
            (f"tests[{index}].no_decisions[{i}]", "policy", w.policy)
            for i, w in enumerate(case.no_decisions)
            if w.policy is not None
        ]
        for where, key, name in named:
            if name not in known:
                line = spec.lines.get(where, spec.lines[f"tests[{index}]"])
                message = (
                    f"{where}.{key}: unknown policy {name!r} (known: {', '.join(sorted(known))})"
                )
                errors.append(RuleError(spec.file, line, message))
    if errors:
        raise RulesError(errors)


def _end(case: CaseModel, evaluation_interval: float) -> float:
    """The last evaluation time of a test, relative to its start."""
    interval = case.interval or evaluation_interval
    ends = [(len(s.values) - 1) * interval for s in case.input_series]
    ends += [d.at for d in case.expected_decisions] + [w.end for w in case.no_decisions]
    return max(ends, default=0.0)


def _openmetrics(
    spec: TestFile, index: int, case: CaseModel, base: int, evaluation_interval: float
) -> list[str]:
    interval = case.interval or evaluation_interval
    lines = []
    for item, series in enumerate(case.input_series):
        name, labels = _parse_series(spec, f"tests[{index}].input_series[{item}]", series.series)
        text_labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        head = f"{name}{{{text_labels}}}" if text_labels else name
        for step, value in enumerate(_until_stale(series.values)):
            if value is not None:
                lines.append((name, f"{head} {_number(value)} {base + step * interval:.3f}"))
    lines.sort(key=lambda pair: pair[0])  # OpenMetrics: a metric family's lines are contiguous
    return [line for _, line in lines]


def _millis(line: str) -> str:
    """An OpenMetrics sample line (timestamp in seconds) as Prometheus text (milliseconds)."""
    head, stamp = line.rsplit(" ", 1)
    return f"{head} {round(float(stamp) * 1000)}"


def _until_stale(values: list[Value]) -> list[float | None]:
    out: list[float | None] = []
    for value in values:
        if value == STALE:
            break
        out.append(value if isinstance(value, float) else None)
    return out


def _parse_series(spec: TestFile, where: str, text: str) -> tuple[str, dict[str, str]]:
    """``metric{a="b"}`` → name and labels, read by prometheus_client's exposition parser."""
    try:
        families = list(text_string_to_metric_families(f"{text} 0\n"))
        sample = families[0].samples[0]
    except (ValueError, IndexError, KeyError):
        line = spec.lines.get(where, 1)
        message = f'{where}.series: invalid series {text!r} (expected metric{{label="value"}})'
        raise RulesError([RuleError(spec.file, line, message)]) from None
    return sample.name, dict(sample.labels)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _create_blocks(workdir: Path, lines: list[str]) -> None:
    source = workdir / "input.om"
    source.write_text("\n".join([*lines, "# EOF", ""]), encoding="utf-8")
    data = workdir / "data"
    data.mkdir()
    if not lines:
        return
    promtool = find_binary("promtool")
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()[-1000:]
        raise PolicyTestError(f"promtool tsdb create-blocks-from openmetrics failed: {output}")


def _query(url: str, expr: str, at: float) -> tuple[Sample, ...]:
    try:
        response = requests.get(
            f"{url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=30
        )
        body = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise PolicyTestError(f"query {expr!r} failed: {exc}") from exc
    if body.get("status") != "success":
        raise PolicyTestError(f"query {expr!r} failed: {body.get('error', response.text[:256])}")
    data = body["data"]
    if data["resultType"] == "scalar":
        return (Sample({}, float(data["result"][1]), float(data["result"][0])),)
    if data["resultType"] != "vector":
        raise PolicyTestError(f"query {expr!r} returned a {data['resultType']}, not a vector")
    return tuple(
        Sample(item["metric"], float(item["value"][1]), float(item["value"][0]))
        for item in data["result"]
    )


def _run_case(
    url: str, ruleset: RuleSet, case: CaseModel, base: int, evaluation_interval: float
) -> CaseResult:
    names = set(case.policies) if case.policies is not None else None
    policies = [p for p in ruleset.policies() if p.expr and (names is None or p.name in names)]
    seen = _evaluate(url, policies, base, _end(case, evaluation_interval), evaluation_interval)
    expected = sorted(
        Seen(d.at, d.policy, d.transition, tuple(sorted(d.target.items())))
        for d in case.expected_decisions
    )
    problems: list[str] = []
    if expected != seen:
        problems.append("decisions differ (- expected, + got):")
        diff = difflib.ndiff([str(s) for s in expected], [str(s) for s in seen])
        problems.extend(line for line in diff if not line.startswith("?"))
    for window in case.no_decisions:
        inside = [
            s
            for s in seen
            if window.start <= s.at <= window.end and window.policy in (None, s.policy)
        ]
        for s in inside:
            span = f"{format_duration(window.start)}..{format_duration(window.end)}"
            problems.append(f"decision in no_decisions window {span}: {s}")
    return CaseResult(case.name, tuple(problems), tuple(seen))


def _evaluate(
    url: str, policies: list[Policy], base: int, end: float, interval: float
) -> list[Seen]:
    """Every decision of ``policies`` from ``base`` to ``base + end``, one step per interval."""
    states = {p.name: PolicyState() for p in policies}
    seen: list[Seen] = []
    steps = int(round(end / interval)) + 1
    for step in range(steps):
        offset = round(step * interval, 3)
        now = base + offset
        for policy in policies:
            state = states[policy.name]
            samples = _query(url, policy.expr or "", now)
            clear = None
            if policy.clear_expr and state.firing():
                clear = _query(url, policy.clear_expr, now)
            result = evaluate(policy, QueryResult(samples, clear), state, now)
            states[policy.name] = result.state
            seen.extend(_seen(d, base) for d in result.decisions)
    return sorted(seen)


def _seen(decision: Decision, base: int) -> Seen:
    target = tuple(sorted(decision.target.labels.items()))
    return Seen(round(decision.at - base, 3), decision.policy, str(decision.transition), target)
