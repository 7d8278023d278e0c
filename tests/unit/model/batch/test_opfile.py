"""Operation and nodes files: what they read, and each problem as FILE:LINE: field: what."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.model.batch.nodefile import parse_nodes
from gpuops.model.batch.operation import Availability, Budget, OnStop, StepKind
from gpuops.model.batch.opfile import load_operation, parse_operation
from gpuops.model.rules.model import RulesError

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "examples" / "batch" / "driver-upgrade.operation.yaml"


def test_the_shipped_example_reads() -> None:
    op = load_operation(EXAMPLE)
    assert op.name == "driver-550"
    assert op.step.kind is StepKind.ANSIBLE
    assert op.step.playbook == str(EXAMPLE.parent / "driver-upgrade.yml")
    assert op.step.extra_vars == {"driver_version": "550.54.15"}
    assert op.max_unavailable == Budget(percent=10.0)
    assert (op.canary, op.max_parallel, op.failure_threshold) == (2, 5, 2)
    assert op.reboot is not None and op.reboot.inventory == op.step.inventory
    assert not op.enforce and op.quarantine == "scheduler"
    assert op.validate is not None and op.validate.timeout_s == 600.0


def problems(text: str, folder: Path | None = None) -> list[str]:
    with pytest.raises(RulesError) as caught:
        parse_operation(text, "op.yaml", folder)
    return [str(e) for e in caught.value.errors]


def test_unknown_step_name_is_refused_with_its_line() -> None:
    text = "operation: x\ntargets: {pool: a}\nstep:\n  ansibel: up.yml\n"
    assert problems(text) == [
        "op.yaml:4: step.ansibel: unknown step 'ansibel', did you mean \"ansible\"? (a step is"
        " one of: ansible, command; with extra_vars, inventory, timeout)"
    ]


def test_missing_playbook_is_refused(tmp_path: Path) -> None:
    text = "operation: x\ntargets: {pool: a}\nstep:\n  ansible: nowhere.yml\n"
    assert problems(text, tmp_path) == [
        f"op.yaml:4: step.ansible: playbook nowhere.yml not found (looked for"
        f" {tmp_path / 'nowhere.yml'})"
    ]


@pytest.mark.parametrize("where", ["../outside.yml", "{outside}"])
def test_a_playbook_outside_the_operations_folder_is_refused(tmp_path: Path, where: str) -> None:
    folder, outside = tmp_path / "ops", tmp_path / "outside.yml"
    folder.mkdir()
    outside.write_text("- hosts: all\n  tasks: []\n")
    where = where.format(outside=outside)
    text = f"operation: x\ntargets: {{pool: a}}\nstep:\n  ansible: {where}\n"
    assert problems(text, folder) == [
        f"op.yaml:4: step.ansible: playbook {where} is outside the operation's folder {folder}"
    ]


def test_bad_fields_are_each_named() -> None:
    text = (
        "operation: x\n"
        "targets: {nodes: [a], pool: p}\n"
        "step: {command: 'reboot now'}\n"
        "max_unavailable: 0\n"
        "canary: -1\n"
        "validate: {timeout: soon}\n"
    )
    assert problems(text) == [
        "op.yaml:2: targets: nodes is a list of its own: give either nodes or a selector, not both",
        "op.yaml:3: step.command: expected a command as a list of arguments (argv, no shell),"
        ' found "reboot now"',
        "op.yaml:6: validate: missing: command (the health gate, argv)",
        "op.yaml:5: canary: expected a whole number of at least 0, found -1 (integer)",
        "op.yaml:4: max_unavailable: expected a number of nodes (at least 1) or a percentage such"
        " as 10%, found 0 (integer)",
    ]


def test_on_stop_finish_by_default_cancel_when_asked_anything_else_refused() -> None:
    text = "operation: x\ntargets: {nodes: [a]}\nstep: {command: [up]}\n"
    assert parse_operation(text, "op.yaml").on_stop is OnStop.FINISH
    assert parse_operation(text + "on_stop: cancel\n", "op.yaml").on_stop is OnStop.CANCEL
    assert problems(text + "on_stop: kill\n") == [
        "op.yaml:4: on_stop: expected what a running step does when the operation stops:"
        ' finish or cancel, found "kill"'
    ]


def test_nodes_file() -> None:
    nodes = parse_nodes(
        "nodes:\n  - {name: a, pool: p, gpus: 4, state: drained, reason: burn-in}\n  - {name: b}\n",
        "n.yaml",
    )
    assert nodes[0].availability is Availability.DRAINED and nodes[0].gpus == 4
    assert nodes[1].pool == "" and not nodes[1].unavailable
    with pytest.raises(RulesError) as caught:
        parse_nodes("nodes:\n  - {name: a, state: sleepy}\n  - {name: a}\n", "n.yaml")
    assert [str(e) for e in caught.value.errors] == [
        'n.yaml:2: nodes[0].state: expected one of up, drained, down, found "sleepy"',
        "n.yaml:3: nodes[1].name: node a is listed twice",
    ]
