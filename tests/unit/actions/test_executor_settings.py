"""Executor settings as the engine configuration gives them (``executors.<name>``): a text
setting given as a number is its text, a null one takes its default, an empty ``token_file`` is
not set; what the executors refuse, they refuse when built (the gate's first action of them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import responses

from gpuops.actions.base import execute
from gpuops.actions.fleet import FleetExecutor
from gpuops.actions.logical import SchedulerExecutor
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.actions.registry import ExecutorRegistry
from tests.unit.actions.support import agent_decision


def agent_headers(settings: dict[str, Any], **labels: str) -> dict[str, str]:
    """The headers of the one request a downclock sends to the agent at 127.0.0.1."""
    with responses.RequestsMock() as mock:
        mock.add(responses.POST, re.compile(r"http://127\.0\.0\.1:9835/.*"), json={})
        outcome = execute(
            NvmlAgentExecutor(settings),
            agent_decision("downclock", {"max_clock_mhz": 900}, **labels),
        )
        assert outcome.ok, outcome.error
        (call,) = mock.calls
        return dict(call.request.headers)


def test_a_numeric_token_is_its_digits() -> None:
    assert agent_headers({"token": 123456})["Authorization"] == "Bearer 123456"


@pytest.mark.parametrize("token", ["", 0])
def test_an_empty_token_sends_none_and_reads_no_file(tmp_path: Path, token: object) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n", encoding="utf-8")
    headers = agent_headers({"token": token, "token_file": str(token_file)})
    assert "Authorization" not in headers


def test_an_empty_token_file_is_not_set() -> None:
    """``token_file: ""`` names no file: the executor is built, and sends no token."""
    registry = ExecutorRegistry.from_entry_points()
    executor = registry.create("nvml-agent", {"token_file": ""})
    assert isinstance(executor, NvmlAgentExecutor) and executor.settings.token_file is None
    assert "Authorization" not in agent_headers({"token_file": ""})


def test_a_numeric_gpu_label_names_the_label() -> None:
    executor = NvmlAgentExecutor({"gpu_label": 5})
    assert executor.gpu_label == "5"
    with responses.RequestsMock() as mock:
        mock.add(responses.POST, "http://127.0.0.1:9835/api/v1/gpus/3/clocks", json={})
        decision = agent_decision("downclock", {"max_clock_mhz": 900}, **{"5": "3"})
        assert execute(executor, decision).ok


def test_null_agent_settings_take_their_defaults() -> None:
    executor = NvmlAgentExecutor({"url": None, "gpu_label": None, "timeout_s": None})
    assert (executor.url_template, executor.gpu_label, executor.timeout_s) == (
        "http://{node}:9835",
        "uuid",
        10.0,
    )
    assert agent_headers({"timeout_s": None, "token": None}).get("Idempotency-Key") == "dec-1"


def test_fleet_settings_as_given() -> None:
    assert FleetExecutor({"url": 5}).url == "5"
    null = FleetExecutor({"url": None, "timeout_s": None})
    assert (null.url, null.timeout_s) == ("http://127.0.0.1:9400", 5.0)
    with pytest.raises(ValueError, match=r"executors.fleet settings: timeout_s: "):
        FleetExecutor({"timeout_s": "x"})


def test_a_logical_executor_reads_names_as_text() -> None:
    """``by_verb: {notify: 5}`` names the executor ``'5'``: there is none of that name."""
    registry = ExecutorRegistry.from_entry_points()
    with pytest.raises(KeyError, match="unknown executor '5'"):
        SchedulerExecutor({"use": "fleet", "by_verb": {"notify": 5}}, registry=registry)
    built = SchedulerExecutor(
        {"use": "fleet", "by_verb": None, "settings": {"fleet": [], "log": None}},
        registry=registry,
    )
    assert built.executor_for("scale_out").name == "fleet"
