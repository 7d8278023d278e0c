"""The engine's ``nvml-agent`` executor against a real node agent (exporter server over the fake
NVML) on a loopback port."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from gpuops.actions.base import PermanentError, TemporaryError, execute
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.actions.retry import RetryPolicy
from gpuops.exporters.nvml import nvml, scenarios
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.model.decisions import OutcomeStatus
from tests.unit.actions.support import UUID0, agent_decision

TOKEN = "executor-token"


def executor(server: ExporterServer, **settings: Any) -> NvmlAgentExecutor:
    return NvmlAgentExecutor({"url": f"http://{{node}}:{server.port}", "token": TOKEN, **settings})


def test_downclock_then_restore(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(2)
    server = serve(fake, TOKEN)
    ex = executor(server)
    changed = ex.run(agent_decision("downclock", {"max_clock_mhz": 1095, "min_clock_mhz": 600}))
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
    restored = ex.run(agent_decision("restore_clocks", did="dec-2"))
    assert restored["previous_clocks_mhz"] == [600, 1095]
    assert fake.gpus[0].locked_clocks is None


def test_a_retried_decision_has_no_second_effect(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(1)
    server = serve(fake, TOKEN)
    ex = executor(server)
    assert ex.run(agent_decision("downclock", {"max_clock_mhz": 1100}))["replayed"] is False
    fake.gpus[0].locked_clocks = None
    assert ex.run(agent_decision("downclock", {"max_clock_mhz": 1100}))["replayed"] is True
    assert fake.gpus[0].locked_clocks is None


def test_no_permission_is_a_permanent_failure_saying_root_is_needed(
    serve: Callable[..., ExporterServer],
) -> None:
    server = serve(scenarios.no_permission(), TOKEN)
    outcome = execute(executor(server), agent_decision("downclock", {"max_clock_mhz": 1100}))
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
        executor(server, token="wrong").run(agent_decision("downclock", {"max_clock_mhz": 1100}))
    with pytest.raises(PermanentError, match="answered 400: GPU 0 .* supports graphics clocks"):
        executor(server).run(agent_decision("downclock", {"max_clock_mhz": 9999}))


def test_5xx_and_unreachable_agents_are_temporary(serve: Callable[..., ExporterServer]) -> None:
    server = serve(scenarios.library_missing(), TOKEN)
    with pytest.raises(TemporaryError, match="answered 503: NVML is not available on this node"):
        executor(server).run(agent_decision("downclock", {"max_clock_mhz": 1100}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    ex = NvmlAgentExecutor({"url": f"http://{{node}}:{closed_port}", "token": TOKEN})
    with pytest.raises(TemporaryError, match="unreachable"):
        ex.run(agent_decision("restore_clocks"))
    slept: list[float] = []
    outcome = execute(
        ex, agent_decision("restore_clocks"), RetryPolicy(attempts=3), sleep=slept.append
    )
    assert (outcome.status, outcome.attempts, slept) == (OutcomeStatus.FAILURE, 3, [0.5, 1.0])


def test_gpu_label_can_name_the_index(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(2)
    server = serve(fake, TOKEN)
    executor(server, gpu_label="gpu").run(
        agent_decision("downclock", {"max_clock_mhz": 1500}, gpu="1")
    )
    assert fake.gpus[1].locked_clocks == (345, 1500)


def test_a_reset_applies_a_pending_row_remap_and_the_check_then_passes(
    serve: Callable[..., ExporterServer],
) -> None:
    fake = scenarios.healthy_h100(2)
    volatile = (nvml.ECC_ERRORS["uncorrected"], nvml.ECC_COUNTERS["volatile"])
    fake.gpus[0].remapped_rows = (0, 1, 1, 0)
    fake.gpus[0].ecc = {volatile: 2}
    ex = executor(serve(fake, TOKEN))
    with pytest.raises(PermanentError) as caught:
        ex.run(agent_decision("validate", did="check-1"))
    assert str(caught.value).endswith(
        "is not healthy: a row remapping is pending (a reset applies it); 2 uncorrected ECC"
        " error(s) since the driver loaded"
    )
    reset = ex.run(agent_decision("reset_gpu", did="reset-1"))
    assert (reset["action"], reset["reset"], reset["replayed"]) == ("reset_gpu", True, False)
    assert ex.run(agent_decision("reset_gpu", did="reset-1"))["replayed"] is True
    assert fake.gpus[0].resets == 1  # the same decision resets once
    checked = ex.run(agent_decision("validate", did="check-2"))
    assert (checked["healthy"], checked["problems"]) == (True, [])


def test_a_lost_gpu_cannot_be_reset_and_fails_its_check(
    serve: Callable[..., ExporterServer],
) -> None:
    fake = scenarios.healthy_h100(1)
    ex = executor(serve(fake, TOKEN))
    assert ex.run(agent_decision("validate", did="check-1"))["healthy"] is True
    fake.gpus[0].lost = True  # falls off the bus
    with pytest.raises(PermanentError, match="answered 409: nvidia-smi --gpu-reset: GPU .* is not"):
        ex.run(agent_decision("reset_gpu"))
    with pytest.raises(PermanentError, match="is not healthy: lost"):
        ex.run(agent_decision("validate", did="check-2"))
    assert fake.gpus[0].resets == 0
