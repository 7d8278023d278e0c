"""One validation: ``gpuops rules check`` refuses exactly what the
engine's reload refuses — executor verbs and params included — with the same messages, and
``--config`` checks the rules an engine configuration names (``type: downclok`` is refused by
both). Verbs and their params come from the verb table (``gpuops.model.verbs``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.actions.fleet import FleetExecutor
from gpuops.cli import cli
from gpuops.model.rules.loader import load_rules_text
from gpuops.model.rules.model import RulesError
from tests.builders import build_engine

GOOD = """
groups:
  - name: g
    rules:
      - policy: slow-down
        expr: util < 0.2
        action: {type: downclock, executor: fleet, params: {max_clock_mhz: 900}}
"""
BROKEN = {
    "verb": (
        GOOD.replace("type: downclock", "type: downclok"),
        "7: groups[0].rules[0].action.type: executor 'fleet' does not do 'downclok' (it does: "
        f"{', '.join(sorted(FleetExecutor.verbs or ()))})",
    ),
    "fleet params": (
        GOOD.replace("max_clock_mhz: 900", "max_clock: 900"),
        "7: groups[0].rules[0].action.params: downclock needs params.max_clock_mhz as a "
        "positive integer (MHz), got None",
    ),
    "agent params": (
        GOOD.replace("executor: fleet", "executor: nvml-agent").replace("900", "-5"),
        "7: groups[0].rules[0].action.params: downclock needs params.max_clock_mhz as a "
        "positive integer (MHz), got -5",
    ),
    "command params": (
        GOOD.replace(
            "{type: downclock, executor: fleet, params: {max_clock_mhz: 900}}",
            "{type: drain, executor: command, params: {argv: [], timeot_s: 5}}",
        ),
        "7: groups[0].rules[0].action.params: command params: argv: List should have at least "
        "1 item after validation, not 0; timeot_s: Extra inputs are not permitted",
    ),
    "program from a label": (
        GOOD.replace(
            "{type: downclock, executor: fleet, params: {max_clock_mhz: 900}}",
            "{type: drain, executor: command, params: {argv: ['{{ $labels.tool }}']}}",
        ),
        "7: groups[0].rules[0].action.params: argv[0] '{{ $labels.tool }}' takes the program "
        "from a label; set program_from_labels: true if the rule means to run what a scraped "
        "label names",
    ),
    "a YAML date in params": (  # recorded as a date, every decision would fail
        GOOD.replace("max_clock_mhz: 900}", "max_clock_mhz: 900, until: 2024-01-01}"),
        "7: groups[0].rules[0].action.params.until: a date (2024-01-01) is no type JSON has "
        "(decisions are stored, audited and sent as JSON); quote it to pass the text",
    ),
    "a params key that is not text": (
        GOOD.replace("max_clock_mhz: 900}", "max_clock_mhz: 900, by: {1: a}}"),
        "7: groups[0].rules[0].action.params.by: a key that is a number (1): params keys are "
        "text (JSON's object keys); quote it",
    ),
    "a NaN in params": (  # the webhook could send no decision
        GOOD.replace("max_clock_mhz: 900}", "max_clock_mhz: 900, threshold: .nan}"),
        "7: groups[0].rules[0].action.params.threshold: .nan is no number JSON can hold "
        "(decisions are stored, audited and sent as JSON); quote it to pass the text",
    ),
    "webhook params": (
        GOOD.replace(
            "{type: downclock, executor: fleet, params: {max_clock_mhz: 900}}",
            "{type: notify, executor: webhook, params: {timeout_s: -1}}",
        ),
        "7: groups[0].rules[0].action.params: webhook params: timeout_s: Input should be "
        "greater than 0",
    ),
}


def check(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["rules", "check", "--no-promql", *args])
    return result.exit_code, result.stdout + result.stderr


def engine_errors(tmp_path: Path, rules: Path) -> tuple[str, ...]:
    engine = build_engine(tmp_path, [rules], reload=False)
    try:
        result = engine.reload()
        return result.errors
    finally:
        engine.stop()


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_refuses_what_the_engine_refuses(tmp_path: Path, case: str) -> None:
    text, message = BROKEN[case]
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    code, out = check(str(path))
    assert code == 1
    assert out.splitlines()[0] == f"{path}:{message}"
    assert engine_errors(tmp_path, path) == (f"{path}:{message}",)


def test_check_accepts_what_the_engine_loads(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD)
    assert check(str(path)) == (
        0,
        "OK: 1 policy in 1 group from 1 file (schema, executors checked)\n",
    )
    assert engine_errors(tmp_path, path) == ()


AS_EVER = """
groups:
  - name: g
    rules:
      - policy: slurm-scale
        expr: up == 0
        target: [pool]
        action: {type: scale_out, executor: slurm, params: {nodes: "2"}}
        on_clear: {type: scale_in, executor: slurm, params: {nodes: 1.0}}
      - policy: fleet-clock
        expr: up == 0
        target: [uuid]
        action:
          type: downclock
          executor: fleet
          params: {max_clock_mhz: "1100", min_clock_mhz: low}
        on_clear: {type: restore_clocks, executor: fleet}
      - policy: agent-clock
        expr: up == 0
        target: [uuid, node]
        action: {type: downclock, executor: nvml-agent, params: {}}
      - policy: quota
        expr: up == 0
        target: [project]
        action: {type: grant_quota, executor: fleet, params: {gpus: 2.5, grant: g}}
        on_clear: {type: release_quota, executor: fleet, params: {grant: null}}
      - policy: sched
        expr: up == 0
        target: [pool]
        action: {type: scale_out, executor: scheduler, params: {nodes: "x"}}
      - policy: hc
        expr: up == 0
        target: [priority_class]
        action: {type: hold_class, executor: fleet, params: {priority_class: [a]}}
"""


def test_params_the_executors_always_took_still_load(tmp_path: Path) -> None:
    """Only what an executor's own checks refused before any decision is refused: here the
    node agent's downclock without a clock. Slurm's, the logical executors' and the fleet's
    quota and class params are checked when the action runs."""
    path = tmp_path / "rules.yaml"
    path.write_text(AS_EVER)
    message = (
        f"{path}:21: groups[0].rules[2].action.params: downclock needs params.max_clock_mhz as "
        "a positive integer (MHz), got None"
    )
    assert check(str(path)) == (1, f"{message}\n1 error in 1 file\n")
    assert engine_errors(tmp_path, path) == (message,)


def test_check_with_config_checks_the_rules_it_names(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "a.yaml").write_text(BROKEN["verb"][0])
    config = tmp_path / "engine.yaml"
    config.write_text("rules: [rules]\nmetrics_listen: null\n")
    code, out = check("--config", str(config))
    assert code == 1
    assert out.splitlines()[0] == f"{tmp_path / 'rules' / 'a.yaml'}:{BROKEN['verb'][1]}"
    (tmp_path / "rules" / "a.yaml").write_text(GOOD)
    assert check("--config", str(config))[0] == 0
    assert check()[0] == 2  # neither paths nor --config: a usage error


def test_a_params_value_json_cannot_hold_is_named_at_its_own_line() -> None:
    """In block style the error names the key's own line, not that of the mapping holding
    it; each value YAML made into what JSON has no type for, in YAML's words."""
    text = """
groups:
  - name: g
    rules:
      - policy: slow-down
        expr: util < 0.2
        action:
          type: downclock
          executor: fleet
          params:
            max_clock_mhz: 900
            by:
              a: 1
              1: z
            at: 2024-01-01T10:00:00Z
            tags: !!set {x, y}
            ceiling: -.inf
"""
    with pytest.raises(RulesError) as caught:
        load_rules_text(text, "block.yaml")
    path = "groups[0].rules[0].action.params"
    assert [str(e) for e in caught.value.errors] == [
        f"block.yaml:14: {path}.by: a key that is a number (1): params keys are text (JSON's "
        "object keys); quote it",
        f"block.yaml:15: {path}.at: a timestamp (2024-01-01T10:00:00+00:00) is no type JSON has "
        "(decisions are stored, audited and sent as JSON); quote it to pass the text",
        f"block.yaml:16: {path}.tags: a !!set value is no type JSON has (decisions are stored, "
        "audited and sent as JSON); quote it to pass the text",
        f"block.yaml:17: {path}.ceiling: -.inf is no number JSON can hold (decisions are "
        "stored, audited and sent as JSON); quote it to pass the text",
    ]
