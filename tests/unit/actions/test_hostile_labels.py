"""Labels are data, where no receiver or process is needed: the log executor writes one line
whatever a label holds; a label that cannot be a webhook's host or a command's argument or
program fails the action permanently, naming the label. Through real receivers and processes:
tests/integration/actions/test_hostile_labels.py."""

from __future__ import annotations

import logging

import pytest

from gpuops.actions.base import PermanentError
from gpuops.actions.command import CommandExecutor
from gpuops.actions.log import LogExecutor
from gpuops.actions.webhook import WebhookExecutor
from tests.unit.actions.support import HOSTILE, make_decision


def test_command_refuses_nul_and_a_program_from_a_label() -> None:
    ex = CommandExecutor({})
    with pytest.raises(PermanentError, match=r"argv\[1\] .* renders to 'a\\x00b', with a NUL"):
        ex.run(
            make_decision(
                "drain", "command", {"argv": ["/bin/true", "{{ $labels.n }}"]}, n="a\x00b"
            )
        )
    with pytest.raises(PermanentError, match=r"env V .* renders to 'a\\x00b', with a NUL"):
        params = {"argv": ["/bin/true"], "env": {"V": "{{ $labels.n }}"}}
        ex.run(make_decision("drain", "command", params, n="a\x00b"))
    with pytest.raises(PermanentError, match="takes the program from a label"):
        ex.run(make_decision("drain", "command", {"argv": ["{{ $labels.n }}"]}, n="/bin/sh"))


@pytest.mark.parametrize("value", HOSTILE + ["a\x00b"])
def test_log_writes_one_line_whatever_the_label(
    caplog: pytest.LogCaptureFixture, value: str
) -> None:
    with caplog.at_level(logging.INFO, logger="gpuops.actions.log"):
        LogExecutor().run(make_decision("reclaim", "log", node=value))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\r" not in line and "\x00" not in line
    assert line.startswith("[log] reclaim-idle-gpus reclaim on ")


@pytest.mark.parametrize("value", ["user@evil.example:1", "a/b", "x#y", "a b", "evil?x"])
def test_webhook_refuses_a_label_that_is_no_host(value: str) -> None:
    with pytest.raises(PermanentError, match="label node=.* is not a host name or IP address"):
        WebhookExecutor({"url": "http://{{ $labels.node }}/hook"}).run(make_decision(node=value))
