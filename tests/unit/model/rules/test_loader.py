"""Valid rule files load into the frozen model values, with every key converted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuops.model.decisions import ActionSpec
from gpuops.model.rules.loader import known_executors, load_rules, load_rules_text
from gpuops.model.rules.model import RuleError, RulesError

ROOT = Path(__file__).resolve().parents[4]
VALID = ROOT / "tests" / "fixtures" / "rules" / "valid"


def test_full_fixture_sets_every_field() -> None:
    ruleset = load_rules([VALID / "full.yaml"])
    (group,) = ruleset.groups
    assert (group.name, group.interval_s) == ("everything", 60.0)
    assert group.source == f"{VALID / 'full.yaml'}:3"
    policy, scheduled = group.policies
    assert policy.name == "all-keys"
    assert policy.group == "everything"
    assert policy.description == "A policy that sets every key."
    assert policy.expr == (
        "avg_over_time(nvml_gpu_utilization_ratio[10m]) < 0.30\n"
        "  and on (uuid) gpuops_gpu_allocated == 1"
    )
    assert policy.for_s == 5400.0
    assert policy.keep_firing_for_s == 0.5
    assert policy.clear_expr == "avg_over_time(nvml_gpu_utilization_ratio[2m]) > 0.50"
    assert policy.target == ("node", "uuid")
    assert policy.action.type == "downclock"
    assert policy.action.executor == "nvml-agent"
    assert dict(policy.action.params) == {
        "max_clock_mhz": 1100,
        "note": "GPU {{ $labels.uuid }} at {{ $value }}",
    }
    assert policy.on_clear == ActionSpec("restore_clocks", "nvml-agent")
    assert policy.cooldown_s == 86400.0
    assert policy.repeat_interval_s == 7200.0
    assert (policy.max_per_hour, policy.max_fraction) == (20, 0.1)
    assert policy.population == "gpuops_gpu_allocated"
    assert (policy.mode, policy.on_no_data, policy.approval) == ("enforce", "skip", "required")
    assert policy.schedule is None
    assert scheduled.schedule == "*/5 22-23,0-5 * * *"
    assert dict(policy.trigger_alertmanager or {}) == {
        "alertname": "GPUUnderused",
        "severity": "info",
    }
    assert dict(policy.labels) == {"team": "platform", "owner": "{{ $labels.node }}"}
    assert dict(policy.annotations) == {
        "summary": "GPU {{ $labels.uuid }} on {{$labels.node}} at {{ $value }}"
    }
    assert policy.source == f"{VALID / 'full.yaml'}:6"
    assert policy.path == "groups[0].rules[0]"
    assert policy.key_lines["expr"] == 8
    assert policy.key_lines["clear_expr"] == 13


def test_defaults_of_a_minimal_policy() -> None:
    ruleset = load_rules([VALID / "minimal.yaml"])
    policy = ruleset.policy("log-down-nodes")
    assert policy is not None
    assert ruleset.groups[0].interval_s == 30.0
    assert policy.mode == "dry-run"
    assert policy.on_no_data == "hold"
    assert policy.approval == "none"
    assert policy.for_s == 0.0
    assert policy.target is None
    assert policy.repeat_interval_s is None
    assert policy.on_clear is None
    assert policy.trigger_alertmanager is None
    triggered = ruleset.policy("drain-on-gpu-fell-off-bus")
    assert triggered is not None
    assert triggered.expr is None
    assert dict(triggered.trigger_alertmanager or {}) == {"alertname": "GPUFellOffBus"}


def test_a_directory_loads_its_yaml_and_yml_files_sorted() -> None:
    ruleset = load_rules([VALID / "two-files"])
    assert ruleset.files == (
        str(VALID / "two-files" / "a.yaml"),
        str(VALID / "two-files" / "b.yml"),
    )
    assert [g.name for g in ruleset.groups] == ["first", "second"]


def test_the_shipped_policies_load_in_enforce_mode() -> None:
    ruleset = load_rules([ROOT / "rules"])
    names = sorted(p.name for p in ruleset.policies())
    assert names == [
        "downclock-underused-gpus",
        "migrate-off-down-nodes",
        "reclaim-idle-gpus",
        "scale-out-on-queue",
    ]
    assert {p.mode for p in ruleset.policies()} == {"enforce"}
    # Logical executors: the engine configuration maps them to the fleet or to Slurm.
    assert {p.action.executor for p in ruleset.policies()} == {"scheduler", "gpu-control"}


@pytest.mark.parametrize(
    "folder",
    [
        "rules",
        "rules/slurm",
        "rules/demo",
        "rules/demo-slurm",
        "rules/kubernetes",
        "rules/fleet",
    ],
)
def test_the_shipped_summaries_name_only_labels_their_decisions_keep(folder: str) -> None:
    # a policy's decision keeps its target's labels: an annotation naming any other label of
    # the series would always be told empty ("Node node-0 in pool  is down"); an alert's
    # policy renders with the alert's labels
    for policy in load_rules([ROOT / folder]).policies():
        if policy.expr is None:
            continue
        kept = set(policy.target or ())
        for key, text in policy.annotations.items():
            named = set(re.findall(r"\$labels\.(\w+)", text))
            assert named <= kept, f"{folder}: {policy.name}.annotations.{key}: {named - kept}"


def test_the_slurm_additions_load_in_dry_run() -> None:
    ruleset = load_rules([ROOT / "rules" / "slurm"])
    assert sorted(p.name for p in ruleset.policies()) == [
        "scale-in-idle-cloud-nodes",
        "warn-idle-gpus",
    ]
    assert {p.mode for p in ruleset.policies()} == {"dry-run"}


def test_policy_names_are_unique_across_files(tmp_path: Path) -> None:
    rule = "groups:\n  - name: {g}\n    rules:\n      - policy: same\n        expr: up\n"
    rule += "        action: {{type: notify, executor: log}}\n"
    (tmp_path / "a.yaml").write_text(rule.format(g="one"))
    (tmp_path / "b.yaml").write_text(rule.format(g="two"))
    with pytest.raises(RulesError) as caught:
        load_rules([tmp_path])
    assert caught.value.errors == [
        RuleError(
            str(tmp_path / "b.yaml"),
            4,
            'groups[0].rules[0].policy: duplicate policy name "same" (first defined at '
            f"{tmp_path / 'a.yaml'}:4; policy names must be unique across the rule set)",
        )
    ]


def test_missing_paths_and_empty_directories_are_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(RulesError) as caught:
        load_rules([tmp_path / "nope.yaml", tmp_path / "empty"])
    assert [str(e) for e in caught.value.errors] == [
        f"{tmp_path / 'nope.yaml'}:0: cannot read: no such file or directory",
        f"{tmp_path / 'empty'}:0: no rule files (*.yaml, *.yml) in directory",
    ]


def test_a_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("groups: []  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(RulesError) as caught:
        load_rules([path])
    assert [str(e) for e in caught.value.errors] == [f"{path}:0: cannot read: not UTF-8 text"]


def test_an_executor_registered_by_entry_point_is_accepted() -> None:
    # pyproject registers log and fleet under gpuops.executors; both are also built in.
    assert {"command", "fleet", "log", "nvml-agent", "webhook"} <= set(known_executors())


def test_errors_in_every_rule_are_reported_not_only_the_first() -> None:
    text = (
        "groups:\n  - name: g\n    rules:\n"
        "      - {policy: a, expr: up, for: 5, action: {type: x, executor: log}}\n"
        "      - {policy: b, expr: up, mode: on, action: {type: x, executor: log}}\n"
    )
    with pytest.raises(RulesError) as caught:
        load_rules_text(text, "inline.yaml")
    assert [e.line for e in caught.value.errors] == [4, 5]


def test_rules_error_prints_one_line_per_error() -> None:
    error = RulesError([RuleError("a.yaml", 3, "x: bad"), RuleError("a.yaml", 5, "y: worse")])
    assert str(error) == "a.yaml:3: x: bad\na.yaml:5: y: worse"
