"""Labels are data: hostile label values through every executor.

A value lands in one path segment (decoded back to itself by the receiver), in one argv entry,
in one header, on one log line; one that cannot be made safe fails the action permanently
with a message naming the label. Receivers are real HTTP servers on loopback port 0.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import pytest

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.command import CommandExecutor
from gpuops.actions.fleet import FleetExecutor
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.actions.webhook import WebhookExecutor
from tests.fakes.receiver import Receiver
from tests.unit.actions.support import HOSTILE, make_decision

Serve = Callable[..., Receiver]

UNSAFE = {"..": "would name another path", ".": "would name another path", "a\x00b": "NUL"}
"""Values no path segment can hold: the action fails permanently."""


def _one_segment(path: str, prefix: str, suffix: str) -> str:
    assert path.startswith(prefix) and path.endswith(suffix), path
    middle = path[len(prefix) : len(path) - len(suffix)]
    assert "/" not in middle and "?" not in middle and "#" not in middle, path
    return unquote(middle)


@pytest.mark.parametrize("value", HOSTILE)
def test_fleet_keeps_each_label_in_its_path_segment(receiver: Serve, value: str) -> None:
    r = receiver()
    fleet = FleetExecutor({"url": r.url})
    fleet.run(make_decision("reclaim", "fleet", uuid=value, node="n1"))
    fleet.run(make_decision("migrate", "fleet", uuid="GPU-1", node=value))
    fleet.run(make_decision("scale_out", "fleet", pool=value))
    reclaim, migrate, scale = (x.path for x in r.received)
    assert _one_segment(reclaim, "/api/v1/gpus/", "/reclaim") == value
    assert _one_segment(migrate, "/api/v1/nodes/", "/migrate") == value
    assert _one_segment(scale, "/api/v1/pools/", "/scale_out") == value


@pytest.mark.parametrize("value", sorted(UNSAFE))
def test_fleet_refuses_what_no_segment_can_hold(receiver: Serve, value: str) -> None:
    r = receiver()
    with pytest.raises(PermanentError, match=f"label uuid=.* {UNSAFE[value]}"):
        FleetExecutor({"url": r.url}).run(make_decision("reclaim", "fleet", uuid=value))
    assert r.received == []


@pytest.mark.parametrize("value", [v for v in HOSTILE if v.isascii()])
def test_nvml_agent_encodes_the_gpu_and_refuses_a_hostile_host(receiver: Serve, value: str) -> None:
    agent, thief = receiver(), receiver()
    port = urlsplit(agent.url).port
    ex = NvmlAgentExecutor({"url": f"http://{{node}}:{port}", "token": "s3cret"})
    ex.run(make_decision("restore_clocks", "nvml-agent", node="127.0.0.1", uuid=value))
    assert _one_segment(agent.received[0].path, "/api/v1/gpus/", "/clocks/reset") == value
    with pytest.raises(PermanentError, match="label node=.* is not a host name or IP address"):
        ex.run(make_decision("restore_clocks", "nvml-agent", node=value, uuid="GPU-1"))
    assert len(agent.received) == 1 and thief.received == []  # the token went nowhere else


def test_nvml_agent_accepts_host_names_and_ip_addresses(receiver: Serve) -> None:
    r = receiver()
    port = urlsplit(r.url).port
    ex = NvmlAgentExecutor({"url": f"http://{{node}}:{port}"})
    for node in ("127.0.0.1", "localhost"):
        ex.run(make_decision("restore_clocks", "nvml-agent", node=node, uuid="GPU-1"))
    assert len(r.received) == 2
    # a unicode host name is a name (IDNA): it goes to that host, nowhere else
    with pytest.raises(TemporaryError, match=r"http://xn--gpu---nva1739d2e7c:\d+/api"):
        ex.run(make_decision("restore_clocks", "nvml-agent", node="GPU-ü✓-三", uuid="GPU-1"))
    with pytest.raises(PermanentError, match="label uuid='a.x00b' holds a NUL byte"):
        ex.run(make_decision("restore_clocks", "nvml-agent", node="localhost", uuid="a\x00b"))


@pytest.mark.parametrize("value", HOSTILE)
def test_webhook_keeps_labels_in_path_query_and_headers(receiver: Serve, value: str) -> None:
    r = receiver()
    params = {
        "url": r.url + "/nodes/{{ $labels.node }}/drain?gpu={{ $labels.uuid }}",
        "headers": {"X-Node": "{{ $labels.node }}"},
    }
    WebhookExecutor({}).run(make_decision(params=params, node=value, uuid=value))
    got = r.received[0]
    path, _, query = got.path.partition("?")
    assert _one_segment(path, "/nodes/", "/drain") == value
    assert query.startswith("gpu=") and unquote(query[4:]) == value and "&" not in query
    assert unquote(got.headers["X-Node"]) == value
    assert "X-Injected" not in got.headers


def test_webhook_takes_a_host_and_port_label(receiver: Serve) -> None:
    r = receiver()
    instance = urlsplit(r.url).netloc  # 127.0.0.1:PORT, an `instance` label
    WebhookExecutor({"url": "http://{{ $labels.instance }}/hook"}).run(
        make_decision(instance=instance)
    )
    assert r.received[0].path == "/hook"


@pytest.mark.parametrize("value", [*HOSTILE, "..", "."])
def test_command_passes_each_label_as_one_argument(value: str) -> None:
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "{{ $labels.node }}", "x{{ $labels.node }}"]
    done = CommandExecutor({}).run(make_decision("drain", "command", {"argv": argv}, node=value))
    assert json.loads(str(done["stdout"])) == [value, "x" + value]
