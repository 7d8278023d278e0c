"""The node agent's reboot (``POST /api/v1/node/reboot``) and the ``nvml-agent`` executor's
``reboot`` against it, over the fake NVML, the reboot command a script that draws a new boot
id (``tests.fakes.reboot``): once per decision id, across an agent restarted by its reboot;
authenticated; of the node it names only; the command's failure told, unless the node rebooted
all the same; a reboot recorded and never started told at the agent's start; the executor
waiting for the new boot of its node."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.exporters.nvml import scenarios
from gpuops.exporters.nvml.reboot import Rebooter
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.model.decisions import Decision
from tests.fakes.reboot import FakeBoot
from tests.unit.actions.support import agent_decision
from tests.waiting import wait_for

TOKEN = "reboot-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODE = "127.0.0.1"
"""The node of the decisions' targets (``agent_decision``), as its agent knows its name."""

Agent = Callable[..., ExporterServer]


@pytest.fixture
def boot(tmp_path: Path) -> FakeBoot:
    return FakeBoot(tmp_path / "node")


@pytest.fixture
def agent(tmp_path: Path, boot: FakeBoot, serve: Callable[..., ExporterServer]) -> Agent:
    """Start a node agent whose reboot command is the fake boot's, its state in tmp."""

    def start(
        fail: bool = False, reboot: bool = True, killed: bool = False, node: str = NODE
    ) -> ExporterServer:
        command = boot.command(fail, killed)
        rebooter = Rebooter(tmp_path / "state", command, boot.boot_id, node=node)
        return serve(scenarios.healthy_h100(1), TOKEN, rebooter=rebooter if reboot else None)

    return start


def executor(server: ExporterServer, **settings: object) -> NvmlAgentExecutor:
    return NvmlAgentExecutor(
        {
            "url": f"http://{{node}}:{server.port}",
            "token": TOKEN,
            "reboot_poll_s": 0.05,
            "reboot_timeout_s": 30,
            **settings,
        }
    )


def on_a_clock(
    server: ExporterServer, then: Callable[[], None] = lambda: None
) -> tuple[NvmlAgentExecutor, list[float]]:
    """An executor waiting up to 60 s on a clock that each of its sleeps moves on (and then
    calls ``then``), and that clock."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        then()

    ex = NvmlAgentExecutor(
        {"url": f"http://{{node}}:{server.port}", "token": TOKEN, "reboot_timeout_s": 60},
        sleep=sleep,
        clock=lambda: now[0],
    )
    return ex, now


def reboot(did: str = "reboot-1") -> Decision:
    return agent_decision("reboot", did=did)


def post(server: ExporterServer, body: dict[str, object], **headers: str) -> requests.Response:
    """A reboot request for this node (unless ``body`` names another or none)."""
    url = f"http://127.0.0.1:{server.port}/api/v1/node/reboot"
    return requests.post(url, json={"node": NODE, **body}, headers=headers, timeout=5)


def state(tmp: Path, text: str) -> None:
    """The agent's reboot state, as a test leaves it."""
    (tmp / "state").mkdir()
    (tmp / "state" / "reboots.json").write_text(text, encoding="utf-8")


def test_the_executor_reboots_the_node_and_waits_for_its_new_boot(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent()
    before = boot.boot_id()
    done = executor(server).run(reboot(did="reboot-1"))
    assert boot.reboots == 1
    assert done["rebooted"] is True and done["replayed"] is False
    assert done["boot_id"] == before and done["now_boot_id"] == boot.boot_id() != before
    kept = json.loads((tmp_path / "state" / "reboots.json").read_text())
    assert list(kept) == ["reboot-1"] and kept["reboot-1"]["boot_id"] == before


def test_what_a_request_carries_never_reaches_the_reboot_command(
    agent: Agent, boot: FakeBoot
) -> None:
    hostile = "d1; reboot -f $(id) `x` --force"
    server = agent()
    resp = post(server, {"decision_id": hostile}, Authorization=f"Bearer {TOKEN}")
    assert resp.json()["decision_id"] == hostile
    wait_for(lambda: boot.reboots == 1, 30, "the reboot command")
    assert boot.argv() == [boot.command()[2:]]  # its own arguments, nothing else


def test_a_retried_decision_never_reboots_twice_even_from_an_agent_started_anew(
    agent: Agent, boot: FakeBoot
) -> None:
    server = agent()
    ex = executor(server)
    ex.run(reboot(did="reboot-1"))
    assert ex.run(reboot(did="reboot-1"))["replayed"] is True
    server.close()  # the agent comes back after the reboot, its state on disk
    again = executor(agent()).run(reboot(did="reboot-1"))
    assert again["rebooted"] is True and again["replayed"] is True
    assert boot.reboots == 1
    executor(agent()).run(reboot(did="reboot-2"))  # another decision does
    assert boot.reboots == 2


def test_a_retry_while_the_reboot_is_under_way_waits_for_it(agent: Agent, boot: FakeBoot) -> None:
    server = agent()
    first = post(server, {"decision_id": "reboot-1"}, **AUTH).json()
    assert first["rebooting"] is True and first["replayed"] is False
    done = executor(server).run(reboot(did="reboot-1"))
    assert done["rebooted"] is True and done["boot_id"] == first["boot_id"]
    assert boot.reboots == 1


def test_an_unauthenticated_reboot_is_refused_and_nothing_reboots(
    agent: Agent, boot: FakeBoot
) -> None:
    server = agent()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        refused = post(server, {"decision_id": "reboot-1"}, **headers)
        assert refused.status_code == 401
        assert refused.json() == {"error": "a valid bearer token is required"}
        assert refused.headers["WWW-Authenticate"] == 'Bearer realm="gpuops-nvml-agent"'
    url = f"http://127.0.0.1:{server.port}/api/v1/node"
    assert requests.get(url, timeout=5).status_code == 401
    with pytest.raises(PermanentError, match="answered 401: a valid bearer token is required"):
        executor(server, token="wrong").run(reboot())
    assert boot.reboots == 0


def test_a_reboot_needs_a_decision_id_and_the_agents_consent(agent: Agent, boot: FakeBoot) -> None:
    server = agent()
    missing = post(server, {}, **AUTH)
    assert missing.status_code == 400
    assert missing.json() == {
        "error": "decision_id is required: a node is rebooted once per decision"
    }
    nameless = post(server, {"decision_id": "reboot-1", "node": None}, **AUTH)
    assert nameless.status_code == 400
    assert nameless.json() == {"error": "node is required: the name of the node to reboot"}
    number = post(server, {"decision_id": "reboot-1", "node": 7}, **AUTH)
    assert number.status_code == 400
    assert number.json() == {"error": "node must be a string: the name of the node to reboot"}
    off = agent(reboot=False)
    refused = post(off, {"decision_id": "reboot-1"}, **AUTH)
    assert refused.status_code == 404
    assert refused.json() == {
        "error": "the node agent's reboot is off (start it with --agent-reboot)"
    }
    node = requests.get(f"http://127.0.0.1:{off.port}/api/v1/node", headers=AUTH, timeout=5)
    assert node.json() == {"boot_id": None, "reboot": False}
    assert boot.reboots == 0


def test_a_failed_reboot_command_is_told_to_the_retry_and_never_run_again(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent(fail=True)
    assert post(server, {"decision_id": "reboot-1"}, **AUTH).json()["rebooting"] is True

    def told() -> bool:
        state = tmp_path / "state" / "reboots.json"
        return "failed" in json.loads(state.read_text())["reboot-1"]

    wait_for(told, 30, "the reboot command's failure")
    with pytest.raises(PermanentError) as failed:
        executor(server).run(reboot())
    assert str(failed.value) == (
        f"nvml-agent http://127.0.0.1:{server.port}/api/v1/node/reboot answered 409: the"
        " reboot of decision reboot-1 failed: the reboot command exited 1: Failed to reboot"
        " system via logind: Access denied"
    )
    assert boot.reboots == 0


def test_a_node_that_does_not_come_back_is_a_temporary_failure_naming_the_wait(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent()
    asked = {"reboot-1": {"boot_id": boot.boot_id(), "at": 0, "started": 0}}
    state(tmp_path, json.dumps(asked))  # asked before, and the node never went down
    ex, now = on_a_clock(server)
    with pytest.raises(TemporaryError) as waited:
        ex.run(reboot())
    assert str(waited.value) == (
        f"node of http://127.0.0.1:{server.port} did not come back from its reboot within"
        f" 60 s (still boot {boot.boot_id()})"
    )
    assert now[0] == 65.0  # every 5 s, the default, until past the deadline
    assert boot.reboots == 0


def test_an_unreadable_state_refuses_the_reboot(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent()
    state(tmp_path, "{not json")
    refused = post(server, {"decision_id": "reboot-1"}, **AUTH)
    assert refused.status_code == 503
    assert refused.json()["error"].startswith(
        f"the reboot state {tmp_path / 'state' / 'reboots.json'} is not JSON"
    )
    assert refused.json()["error"].endswith(": no reboot")
    with pytest.raises(TemporaryError, match="answered 503: the reboot state"):
        executor(server).run(reboot())
    assert boot.reboots == 0


def test_a_reboot_meant_for_another_node_is_refused_naming_both_and_nothing_reboots(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent(node="gpu-7")  # the address of the decision's node leads to gpu-7's agent
    refused = post(server, {"decision_id": "reboot-1", "node": "gpu-8"}, **AUTH)
    assert refused.status_code == 409
    assert refused.json() == {
        "error": "this agent is on node gpu-7, the reboot of decision reboot-1 is for node"
        " gpu-8: nothing rebooted"
    }
    with pytest.raises(PermanentError) as failed:
        executor(server).run(reboot())
    assert str(failed.value) == (
        f"nvml-agent http://127.0.0.1:{server.port}/api/v1/node/reboot answered 409: this"
        " agent is on node gpu-7, the reboot of decision reboot-1 is for node 127.0.0.1:"
        " nothing rebooted"
    )
    assert boot.reboots == 0
    assert not (tmp_path / "state" / "reboots.json").exists()  # nothing recorded either
    node = requests.get(f"http://127.0.0.1:{server.port}/api/v1/node", headers=AUTH, timeout=5)
    assert node.json() == {"node": "gpu-7", "boot_id": boot.boot_id(), "reboot": True}


def test_the_executor_waits_for_its_own_node_not_another_at_the_same_address(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent()
    rebooter = server.rebooter
    assert rebooter is not None
    asked = {"reboot-1": {"boot_id": boot.boot_id(), "at": 0, "started": 0}}
    state(tmp_path, json.dumps(asked))  # under way

    def taken() -> None:
        rebooter.name = "gpu-9"  # another machine, of another boot, took the node's address
        boot.file.write_text("the boot of gpu-9\n", encoding="utf-8")

    ex, _ = on_a_clock(server, taken)
    with pytest.raises(TemporaryError) as waited:
        ex.run(reboot())
    assert str(waited.value) == (
        f"node of http://127.0.0.1:{server.port} did not come back from its reboot within"
        " 60 s (the agent of node gpu-9 answers there)"
    )
    assert boot.reboots == 0


def test_a_reboot_whose_command_the_shutdown_ended_is_rebooted_on_a_replay(
    agent: Agent, boot: FakeBoot, tmp_path: Path
) -> None:
    server = agent(killed=True)  # the command reboots, and the shutdown ends it: SIGTERM
    before = boot.boot_id()
    assert executor(server).run(reboot())["rebooted"] is True

    def told() -> str:
        state = tmp_path / "state" / "reboots.json"
        return str(json.loads(state.read_text())["reboot-1"].get("failed", ""))

    assert wait_for(told, 30, "the command's end") == "the reboot command exited -15: "
    again = executor(agent(killed=True)).run(reboot())  # the agent of the new boot
    assert again["rebooted"] is True and again["replayed"] is True
    assert again["boot_id"] == before != again["now_boot_id"]
    assert boot.reboots == 1


def test_a_reboot_recorded_and_never_started_is_told_at_start_and_refused_on_a_replay(
    agent: Agent, boot: FakeBoot, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    asked = {"reboot-1": {"boot_id": boot.boot_id(), "at": 0}}  # no "started": it stopped there
    state(tmp_path, json.dumps(asked))
    with caplog.at_level(logging.WARNING, logger="gpuops.exporters.nvml.reboot"):
        server = agent()
    why = "its command never started (the agent stopped after recording it)"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"the reboot of decision reboot-1 failed: {why}")
    ]
    refused = post(server, {"decision_id": "reboot-1"}, **AUTH)
    assert refused.status_code == 409
    assert refused.json() == {"error": f"the reboot of decision reboot-1 failed: {why}"}
    with pytest.raises(PermanentError, match="answered 409: the reboot of decision reboot-1"):
        executor(server).run(reboot())
    caplog.clear()
    executor(agent()).run(reboot(did="reboot-2"))  # started, recorded so: no warning again
    assert boot.reboots == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "never" in r.msg]
    kept = json.loads((tmp_path / "state" / "reboots.json").read_text())
    assert kept["reboot-2"]["started"] >= kept["reboot-2"]["at"]


def test_a_target_without_the_node_label_reboots_nothing(agent: Agent, boot: FakeBoot) -> None:
    server = agent()
    ex = NvmlAgentExecutor(
        {"url": f"http://127.0.0.1:{server.port}", "token": TOKEN, "node_label": "host"}
    )
    with pytest.raises(PermanentError) as failed:
        ex.run(reboot())
    key = reboot().target.key
    assert str(failed.value) == f"target {key} has no 'host' label to name the node to reboot"
    assert boot.reboots == 0
