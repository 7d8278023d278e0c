"""``gpuops exporter nvml`` as a real process: it serves a fake scenario's metrics and, with the
agent on, takes a clock lock with its token and reboots the node with its reboot command (a
script drawing a new boot id: ``tests.fakes.reboot``)."""

from __future__ import annotations

import json
import re
import selectors
import shlex
import subprocess
import sys
import time
from pathlib import Path

import requests

from gpuops.sources.promproc import free_port
from tests.fakes.reboot import FakeBoot
from tests.waiting import wait_for


def test_serves_a_fake_scenario_with_the_agent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("cli-token\n", encoding="utf-8")
    boot = FakeBoot(tmp_path / "node")
    argv = [
        sys.executable, "-c", "from gpuops.cli import main; main()",
        "exporter", "nvml", "--fake-nvml", "mig-a100", "--host", "127.0.0.1", "--port", "0",
        "--agent", "--agent-token-file", str(token),
        "--agent-reboot", "--agent-reboot-command", shlex.join(boot.command()),
        "--agent-state-dir", str(tmp_path / "state"), "--agent-boot-id-file", str(boot.file),
        "--node", "cli-node",
    ]  # fmt: skip
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        try:
            port = _check_running(proc)
            before = boot.boot_id()
            resp = requests.post(
                f"http://127.0.0.1:{port}/api/v1/node/reboot",
                json={"decision_id": "cli-reboot", "node": "cli-node"},
                headers={"Authorization": "Bearer cli-token"},
                timeout=5,
            )
            assert resp.json()["boot_id"] == before, resp.text
            wait_for(lambda: boot.boot_id() != before, 30, "the reboot command")
            assert boot.reboots == 1
            assert (tmp_path / "state" / "reboots.json").exists()
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _check_running(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    port = _wait_for_port(proc.stderr)
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'gpu_instance_id="13"' in text
    resp = requests.post(
        f"http://127.0.0.1:{port}/api/v1/gpus/1/clocks",
        json={"max_clock_mhz": 1005},
        headers={"Authorization": "Bearer cli-token"},
        timeout=5,
    )
    assert resp.status_code == 200, resp.text
    return port


def _wait_for_port(stream: object, timeout: float = 60.0, seen: list[str] | None = None) -> int:
    # a deadline, not a wait: the CLI imports the whole engine (~2.3 s CPU), far slower on a
    # loaded machine (it took over 20 s with the suite in 3 workers beside other runs)
    deadline = time.monotonic() + timeout
    seen = [] if seen is None else seen
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        return _read_port(sel, stream, deadline, seen)


def _read_port(
    sel: selectors.BaseSelector, stream: object, deadline: float, seen: list[str]
) -> int:
    while time.monotonic() < deadline:
        if sel.select(timeout=max(0.0, deadline - time.monotonic())):
            line = stream.readline()  # type: ignore[attr-defined]
            seen.append(line)
            match = re.search(r"NVML exporter on http://127\.0\.0\.1:(\d+)/metrics", line)
            if match:
                return int(match.group(1))
            if not line:
                break
    raise AssertionError(f"the exporter did not start: {''.join(seen)}")


def test_pushed_events_the_engine_did_not_take_outlive_the_exporter(tmp_path: Path) -> None:
    """The engine away: the lost GPU's events wait under --agent-state-dir, and the next
    exporter process finds them there."""
    token = tmp_path / "push-token"
    token.write_text("push-token\n", encoding="utf-8")
    state = tmp_path / "state"
    argv = [
        sys.executable, "-c", "from gpuops.cli import main; main()",
        "exporter", "nvml", "--fake-nvml", "gpu-lost", "--host", "127.0.0.1", "--port", "0",
        "--push-url", f"http://127.0.0.1:{free_port()}", "--push-token-file", str(token),
        "--node", "n-cli", "--agent-state-dir", str(state),
    ]  # fmt: skip
    queue = state / "health-events"

    def queued(port: int) -> float:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "nvml_agent_health_queue_on_disk 1.0" in text
        (value,) = re.findall(r"^nvml_agent_health_events_queued (\S+)$", text, flags=re.M)
        return float(value)

    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        try:
            port = _wait_for_port(proc.stderr)
            kinds = {"xid", "gpu_lost"}
            wait_for(lambda: queued(port) and kinds <= held(queue), 30, "XID 79, GPU lost")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    left = [json.loads(p.read_text()) for p in sorted(queue.glob("*.json"))]
    assert {(e["node"], e["gpu"]) for e in left} == {("n-cli", left[0]["gpu"])}
    said: list[str] = []
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert queued(_wait_for_port(proc.stderr, seen=said)) >= len(left)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    found = f"{len(left)} health events a former agent left unsent in {queue}: sending them first"
    assert found in "".join(said)


def held(queue: Path) -> set[str]:
    """The kinds of the events queued in ``queue``."""
    return {json.loads(p.read_text())["kind"] for p in queue.glob("*.json")}
