"""Small inputs with large effects: a cooldown longer than the guardrails remember is refused,
and a rule file emptied to ``groups: []`` does not drop every running policy (``gpus: true`` is
not one GPU: tests/integration/api/test_quota.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuops.model.rules.loader import load_rules_text
from gpuops.model.rules.model import RulesError
from tests.builders import build_engine

RULE = """
groups:
  - name: g
    rules:
      - policy: once-a-month
        expr: up == 0
        action: {{type: notify, executor: log}}
        cooldown: {cooldown}
"""


def test_a_cooldown_up_to_the_guardrail_memory_loads_a_longer_one_is_refused() -> None:
    (policy,) = load_rules_text(RULE.format(cooldown="30d"), "r.yaml").policies()
    assert policy.cooldown_s == 30 * 86400
    with pytest.raises(RulesError) as exc:
        load_rules_text(RULE.format(cooldown="60d"), "r.yaml")
    assert str(exc.value) == (
        "r.yaml:8: groups[0].rules[0].cooldown: cooldown of 60d is longer than the guardrails "
        "remember the last action on a target (30d): it would end early (use at most 30d)"
    )


def test_emptying_the_rules_keeps_the_running_policies(tmp_path: Path) -> None:
    engine = build_engine(tmp_path, {"r.yaml": RULE.format(cooldown="1h")})
    try:
        running = [p.name for p in engine.rules.policies()]
        assert running
        path = tmp_path / "rules" / "r.yaml"
        path.write_text("groups: []\n")
        result = engine.reload()
        assert not result.ok and result.policies == len(running)
        assert result.errors == (
            f"{path}:1: the new rules ({path}) define no policy; the {len(running)} running "
            "policies stay (to run none, pause the engine or stop it)",
        )
        assert [p.name for p in engine.rules.policies()] == running
    finally:
        engine.stop()


def test_starting_with_no_policy_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "empty.yaml").write_text("groups: []\n")
    engine = build_engine(tmp_path, [tmp_path / "empty.yaml"], reload=False)
    try:
        with caplog.at_level(logging.INFO, logger="gpuops.runtime"):
            assert engine.reload().ok
        (record,) = [r for r in caplog.records if "loaded 0 policies" in r.getMessage()]
        assert record.levelno == logging.WARNING
    finally:
        engine.stop()
