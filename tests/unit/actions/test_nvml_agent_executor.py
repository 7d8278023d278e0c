"""The ``nvml-agent`` executor before it calls a node agent: settings and params errors are
permanent, each node's agent is a lane of its own, and the executor is registered by entry
point. Against a real node agent: tests/integration/exporters/test_nvml_agent_executor.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.actions.base import PermanentError
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.actions.registry import ExecutorRegistry
from tests.unit.actions.support import UUID0, agent_decision

TOKEN = "executor-token"


def test_each_node_agent_is_a_lane_of_its_own() -> None:
    """The gate isolates node agents: one that does not answer delays only its node."""
    ex = NvmlAgentExecutor({"url": "http://{node}:9835", "token": TOKEN})
    assert ex.lane(agent_decision("downclock", node="n1")) == "http://n1:9835"
    assert ex.lane(agent_decision("downclock", node="n2")) == "http://n2:9835"
    assert ex.lane(agent_decision("downclock", node="fe80::1")) == "http://[fe80::1]:9835"
    assert ex.lane(agent_decision("downclock", node="not a host")) == ""  # run says why


def test_registered_by_entry_point() -> None:
    registry = ExecutorRegistry.from_entry_points()
    created = registry.create("nvml-agent", {"token": "t"})
    assert isinstance(created, NvmlAgentExecutor)
    assert created.verbs == frozenset(
        {"downclock", "restore_clocks", "reset_gpu", "validate", "reboot"}
    )


def test_settings_and_params_errors_are_permanent(tmp_path: Path) -> None:
    ex = NvmlAgentExecutor({"url": "http://{host}:9835", "token": TOKEN})
    with pytest.raises(PermanentError) as info:
        ex.run(agent_decision("downclock", {"max_clock_mhz": 1100}))
    assert str(info.value) == (
        "nvml-agent url 'http://{host}:9835' needs label 'host', which target "
        f"node=127.0.0.1,uuid={UUID0} does not have"
    )
    with pytest.raises(PermanentError, match=r"params.max_clock_mhz as a positive integer"):
        NvmlAgentExecutor({}).run(agent_decision("downclock", {"max_clock_mhz": "low"}))
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n", encoding="utf-8")
    assert NvmlAgentExecutor({"token_file": str(token_file)})._token == "from-file"
    with pytest.raises(PermanentError, match="has no 'gpu' label"):
        NvmlAgentExecutor({"gpu_label": "gpu"}).run(agent_decision("restore_clocks"))
