"""The ``command`` executor's checks before any process starts: params and settings are
validated, a NUL byte in a rendered argument is refused, and the executor is registered by
entry point. What it does with a real process: tests/integration/actions/test_command.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuops.actions.base import PermanentError
from gpuops.actions.command import CommandExecutor
from gpuops.actions.registry import ExecutorRegistry
from gpuops.model.decisions import Decision
from tests.unit.actions.support import make_decision


def command(argv: list[str], did: str = "dec-cmd-1", **labels: str) -> Decision:
    return make_decision("drain", "command", {"argv": argv}, did=did, **labels)


def run(argv: list[str], settings: dict[str, Any] | None = None, **labels: str) -> Any:
    return CommandExecutor(settings).run(command(argv, **labels))


def test_a_nul_byte_is_refused() -> None:
    with pytest.raises(PermanentError, match=r"argv\[1\] .* renders to .a.*b., with a NUL byte"):
        run(["/bin/echo", "{{ $labels.node }}"], node="a\x00b")


def test_params_and_settings_are_validated() -> None:
    ex = CommandExecutor()
    with pytest.raises(PermanentError) as typo:
        ex.run(make_decision("drain", "command", {"argv": ["/bin/true"], "timeout": 5}))
    assert str(typo.value) == "command params: timeout: Extra inputs are not permitted"
    with pytest.raises(PermanentError) as empty:
        ex.run(make_decision("drain", "command", {"argv": []}))
    assert str(empty.value) == (
        "command params: argv: List should have at least 1 item after validation, not 0"
    )
    allowed = {"argv": ["{{ $labels.x }}"], "program_from_labels": True}
    with pytest.raises(PermanentError, match="argv\\[0\\] '{{ \\$labels.x }}' renders to an empty"):
        ex.run(make_decision("drain", "command", allowed))
    with pytest.raises(PermanentError) as from_label:
        ex.run(command(["{{ $labels.x }}"], x="/bin/sh"))
    assert str(from_label.value) == (
        "argv[0] '{{ $labels.x }}' takes the program from a label; set "
        "params.program_from_labels: true if the rule means to run what a scraped label names"
    )
    with pytest.raises(ValueError) as bad:
        CommandExecutor({"timeout_s": 0})
    assert str(bad.value) == "executors.command settings: timeout_s: Input should be greater than 0"


def test_registered_by_entry_point() -> None:
    created = ExecutorRegistry.from_entry_points().create("command", {"timeout_s": 5})
    assert isinstance(created, CommandExecutor)
    assert created.verbs is None
    assert created.settings.timeout_s == 5.0
