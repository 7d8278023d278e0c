"""A rule edit whose PromQL promtool refuses is not loaded: the running rules stay, and the
error names the file (the engine's rule checks run the real ``promtool check rules``)."""

from __future__ import annotations

from pathlib import Path

from tests.builders import Clock, build_engine
from tests.fakes.executors import Recorder
from tests.fakes.prometheus import FakePrometheus
from tests.unit.runtime.test_runtime import RULES


def test_invalid_promql_in_an_edit_keeps_the_running_rules(tmp_path: Path) -> None:
    engine = build_engine(
        tmp_path, RULES, source=FakePrometheus(), clock=Clock(), executors={"log": Recorder()}
    )
    try:
        rule_file = tmp_path / "rules" / "p.yaml"
        rule_file.write_text(RULES.replace("expr: util < 0.2", "expr: sum(rate(util[5m]) >"))
        result = engine.reload()
        assert not result.ok
        assert any("invalid PromQL" in e and f"{rule_file}:" in e for e in result.errors), result
        policy = engine.rules.policy("reclaim")
        assert policy is not None and policy.expr == "util < 0.2"
    finally:
        engine.stop()
