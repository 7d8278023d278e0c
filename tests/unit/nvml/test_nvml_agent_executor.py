"""The engine's ``nvml-agent`` executor against a real node agent (exporter server over the fake
NVML) on a loopback port."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import (
    ExecutorRegistry,
    PermanentError,
    RetryPolicy,
    TemporaryError,
    execute,
)
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.exporters.nvml import scenarios
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.model.decisions import ActionSpec, Decision, Evidence, OutcomeStatus, Target, Transition

TOKEN = "executor-token"
UUID0 = "GPU-00005100-0000-4a1b-9c2d-000000000000"


def decision(
    verb: str, params: dict[str, Any] | None = None, did: str = "dec-1", **labels: str
) -> Decision:
    target = Target.from_labels({"node": "127.0.0.1", "uuid": UUID0, **labels}, None)
    return Decision(
        id=did,
        policy="downclock-underused-gpus",
        group="gpu-efficiency",
        target=target,
        transition=Transition.FIRE if verb == "downclock" else Transition.CLEAR,
        action=ActionSpec(verb, "nvml-agent", params or {}),
        evidence=Evidence(
            "avg_over_time(nvml_gpu_utilization_ratio[10m]) < 0.30", 0.02, 0.0, 600.0
        ),
        at=600.0,
        episode_start=0.0,
    )


def executor(server: ExporterServer, **settings: Any) -> NvmlAgentExecutor:
    return NvmlAgentExecutor({"url": f"http://{{node}}:{server.port}", "token": TOKEN, **settings})


def test_registered_by_entry_point() -> None:
    registry = ExecutorRegistry.from_entry_points()
    created = registry.create("nvml-agent", {"token": "t"})
    assert isinstance(created, NvmlAgentExecutor)
    assert created.verbs == frozenset({"downclock", "restore_clocks"})


def test_downclock_then_restore(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(2)
    server = serve(fake, TOKEN)
    ex = executor(server)
    changed = ex.run(decision("downclock", {"max_clock_mhz": 1095, "min_clock_mhz": 600}))
    assert changed == {
        "agent": f"http://127.0.0.1:{server.port}",
        "action": "lock_clocks",
        "gpu": 0,
        "uuid": UUID0,
        "min_clock_mhz": 600,
        "max_clock_mhz": 1095,
        "replayed": False,
    }
    assert fake.gpus[0].locked_clocks == (600, 1095)
    restored = ex.run(decision("restore_clocks", did="dec-2"))
    assert restored["previous_clocks_mhz"] == [600, 1095]
    assert fake.gpus[0].locked_clocks is None


def test_a_retried_decision_has_no_second_effect(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(1)
    server = serve(fake, TOKEN)
    ex = executor(server)
    assert ex.run(decision("downclock", {"max_clock_mhz": 1100}))["replayed"] is False
    fake.gpus[0].locked_clocks = None
    assert ex.run(decision("downclock", {"max_clock_mhz": 1100}))["replayed"] is True
    assert fake.gpus[0].locked_clocks is None


def test_no_permission_is_a_permanent_failure_saying_root_is_needed(
    serve: Callable[..., ExporterServer],
) -> None:
    server = serve(scenarios.no_permission(), TOKEN)
    outcome = execute(executor(server), decision("downclock", {"max_clock_mhz": 1100}))
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 1
    assert outcome.error == (
        f"nvml-agent http://127.0.0.1:{server.port}/api/v1/gpus/{UUID0}/clocks answered 403: "
        f"nvmlDeviceSetGpuLockedClocks on GPU 0 ({UUID0}) needs root: NVML answered "
        "Insufficient Permissions; run the exporter as root to use the node agent"
    )


def test_4xx_are_permanent(serve: Callable[..., ExporterServer]) -> None:
    server = serve(scenarios.healthy_h100(1), TOKEN)
    with pytest.raises(PermanentError, match="answered 401: a valid bearer token is required"):
        executor(server, token="wrong").run(decision("downclock", {"max_clock_mhz": 1100}))
    with pytest.raises(PermanentError, match="answered 400: GPU 0 .* supports graphics clocks"):
        executor(server).run(decision("downclock", {"max_clock_mhz": 9999}))


def test_5xx_and_unreachable_agents_are_temporary(serve: Callable[..., ExporterServer]) -> None:
    server = serve(scenarios.library_missing(), TOKEN)
    with pytest.raises(TemporaryError, match="answered 503: NVML is not available on this node"):
        executor(server).run(decision("downclock", {"max_clock_mhz": 1100}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    ex = NvmlAgentExecutor({"url": f"http://{{node}}:{closed_port}", "token": TOKEN})
    with pytest.raises(TemporaryError, match="unreachable"):
        ex.run(decision("restore_clocks"))
    slept: list[float] = []
    outcome = execute(ex, decision("restore_clocks"), RetryPolicy(attempts=3), sleep=slept.append)
    assert (outcome.status, outcome.attempts, slept) == (OutcomeStatus.FAILURE, 3, [0.5, 1.0])


def test_settings_and_params_errors_are_permanent(tmp_path: Path) -> None:
    ex = NvmlAgentExecutor({"url": "http://{host}:9835", "token": TOKEN})
    with pytest.raises(PermanentError) as info:
        ex.run(decision("downclock", {"max_clock_mhz": 1100}))
    assert str(info.value) == (
        "nvml-agent url 'http://{host}:9835' needs label 'host', which target "
        f"node=127.0.0.1,uuid={UUID0} does not have"
    )
    with pytest.raises(PermanentError, match=r"params.max_clock_mhz as a positive integer"):
        NvmlAgentExecutor({}).run(decision("downclock", {"max_clock_mhz": "low"}))
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n", encoding="utf-8")
    assert NvmlAgentExecutor({"token_file": str(token_file)})._token == "from-file"
    with pytest.raises(PermanentError, match="has no 'gpu' label"):
        NvmlAgentExecutor({"gpu_label": "gpu"}).run(decision("restore_clocks"))


def test_gpu_label_can_name_the_index(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(2)
    server = serve(fake, TOKEN)
    executor(server, gpu_label="gpu").run(decision("downclock", {"max_clock_mhz": 1500}, gpu="1"))
    assert fake.gpus[1].locked_clocks == (345, 1500)


def test_each_node_agent_is_a_lane_of_its_own() -> None:
    """The gate isolates node agents: one that does not answer delays only its node."""
    ex = NvmlAgentExecutor({"url": "http://{node}:9835", "token": TOKEN})
    assert ex.lane(decision("downclock", node="n1")) == "http://n1:9835"
    assert ex.lane(decision("downclock", node="n2")) == "http://n2:9835"
    assert ex.lane(decision("downclock", node="fe80::1")) == "http://[fe80::1]:9835"
    assert ex.lane(decision("downclock", node="not a host")) == ""  # run says why
