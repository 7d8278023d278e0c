"""Every command of the README, run as written and in order (issue 16): the ``sh`` blocks are
extracted, the long-running ones (fleet, Prometheus, engine, exporter) are started in the
background and waited for, the others must exit 0 — in a temporary copy of the repository's
config, rules and examples, with every fixed port of the README moved to a free loopback port.

Not run, each for a stated reason (``NOT_RUN``): docker compose (no Docker here), ``make``
(``make test`` runs this test; ``make demo`` has its own), the GPU-only exporter, the lines with
a placeholder to fill in. A README line that is neither run nor listed there fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from gpuops.sources.promproc import free_port
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

NOT_RUN = {
    "make demo": "make demo has its own tests (tests/integration/test_demo_signals.py)",
    "make test": "make test is what runs this test",
    "make setup && . .venv/bin/activate": "the test runs with this venv first on the PATH",
    "gpuops exporter nvml --port 9835": "needs an NVIDIA GPU and its driver",
    "gpuops decisions explain DECISION_ID": "a placeholder: explain is run on a real id below",
    "gpuops approvals grant DECISION_ID": "a placeholder; the shipped policies need no approval",
}
BACKGROUND = ("gpuops fleet sim", "prometheus ", "gpuops engine run", "gpuops exporter nvml")
FIXED_PORTS = (9090, 9200, 9400, 9835, 9836, 9842, 9843)
"""The ports the README and config/engine.yaml name; each becomes a free one (9401, the first
node port, becomes 0: free ports for every node)."""


def readme_commands() -> list[str]:
    """The lines of the README's sh blocks outside the docker compose section, comments cut,
    backslash continuations joined."""
    text = README.read_text()
    text = re.sub(r"\n## The whole stack \(docker compose\)\n.*?(?=\n## )", "\n", text, flags=re.S)
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            command = re.sub(r"\s+#\s.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


@dataclass
class Workspace:
    root: Path
    ports: dict[int, int]
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)

    def local(self, text: str) -> str:
        text = re.sub(r"(?<=[:= ])9401\b", "0", text)
        for fixed, port in self.ports.items():
            text = re.sub(rf"(?<=[:= ]){fixed}\b", str(port), text)
        return text

    def url(self, fixed: int) -> str:
        return f"http://127.0.0.1:{self.ports[fixed]}"

    def run(self, command: str) -> str:
        """A foreground command: exit 0 within 3 minutes; ``export`` lines set the environment
        of the commands that follow."""
        if command.startswith("export "):
            script = f"{command}\nenv -0"
            out = self._bash(script, command)
            self.env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
            return ""
        return self._bash(command, command)

    def _bash(self, script: str, command: str) -> str:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
        self.outputs[command] = done.stdout
        return done.stdout

    def start(self, command: str) -> None:
        """A long-running command in its own process group, its output in a log file."""
        log = (self.root / f"bg-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in self.root.glob("bg-*.log"))


def answers(url: str, ws: Workspace) -> bool:
    assert all(p.poll() is None for p in ws.procs), ws.logs()
    try:
        return requests.get(url, timeout=2).status_code < 500
    except requests.ConnectionError:
        return False


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    for name in ("config", "rules", "examples"):
        shutil.copytree(REPO / name, tmp_path / name)
    ports = {fixed: free_port() for fixed in FIXED_PORTS}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("GPUOPS_TOKEN", None)
    env.pop("GPUOPS_URL", None)
    ws = Workspace(tmp_path, ports, env)
    config = tmp_path / "config" / "engine.yaml"
    config.write_text(ws.local(config.read_text()))
    try:
        yield ws
    finally:
        ws.stop()


def ready_url(command: str, ws: Workspace) -> str:
    if command.startswith("gpuops fleet sim"):
        return f"{ws.url(9400)}/api/v1/state"
    if command.startswith("prometheus "):
        return f"{ws.url(9090)}/-/ready"
    if command.startswith("gpuops engine run"):
        return f"{ws.url(9843)}/healthz"
    return f"{ws.url(9836)}/metrics"


def test_every_readme_command_does_what_the_readme_says(workspace: Workspace) -> None:
    ws = workspace
    commands = readme_commands()
    assert len(commands) > 20, commands
    with FakeElasticsearch() as es:
        ws.ports[9200] = es.port  # `gpuops elk install` meets the faithful fake
        for command in commands:
            if command in NOT_RUN:
                continue
            local = ws.local(command)
            assert not re.search(r"\b(DECISION_ID|\.\.\.)\b", local), f"placeholder: {command}"
            if command.startswith(BACKGROUND):
                ws.start(local)
                url = ready_url(command, ws)
                wait_for(lambda u=url: answers(u, ws), 60, f"{command} to answer")
            else:
                ws.run(local)
        assert any(k.startswith("gpuops elk install") for k in ws.outputs)

    assert len(ws.env.get("GPUOPS_TOKEN", "")) > 20, "export GPUOPS_TOKEN=$(gpuops token new ...)"

    # node-0 failed (README's curl): the shipped migrate policy decides within about a minute,
    # and `gpuops decisions explain` tells why
    def migrate_decisions() -> list[dict[str, str]]:
        listed = ws.run("gpuops decisions list --policy migrate-off-down-nodes --json")
        decisions: list[dict[str, str]] = json.loads(listed)["decisions"]
        return decisions

    decisions = wait_for(migrate_decisions, 120, "migrate-off-down-nodes to decide on node-0")
    found = decisions[0]
    explained = ws.run(f"gpuops decisions explain {found['id']}")
    assert explained.startswith("policy migrate-off-down-nodes decided to fire on node=node-0")

    out = ws.outputs
    # the pieces run together: Prometheus scrapes the fleet's nodes through the written config
    query = f"{ws.url(9090)}/api/v1/query"
    wait_for(
        lambda: requests.get(query, params={"query": 'up{job="gpu-nodes"}'}, timeout=5).json()[
            "data"
        ]["result"],
        60,
        "Prometheus to scrape the fleet's nodes",
    )
    assert "token_sha256" in (ws.root / "var" / "api-tokens.yaml").read_text()
    listed = next(v for k, v in out.items() if k.startswith("gpuops decisions list"))
    assert listed == "" or listed.split()[:3] == ["AT", "ID", "POLICY"], listed
    status = next(v for k, v in out.items() if k.startswith("gpuops control status"))
    assert "dry_run: False" in status and "kill_switch: False" in status, status
    assert "kill_switch: True" in out["gpuops control kill-switch on"]
    assert "kill_switch: False" in out["gpuops control kill-switch off"]
    assert (ws.root / "var" / "gpuops.rules.yml").is_file()
    loaded = next(v for k, v in out.items() if k.startswith("gpuops backtest load-helios"))
    assert "80640 samples of 1 VCs (vchbv)" in loaded, loaded
    week = next(v for k, v in out.items() if "--policy scale-out-on-queue" in k)
    assert "== scale-out-on-queue: 10080 steps of 60s" in week, week
    assert not (ws.root / "data").exists()  # Prometheus kept its data under var/
    assert (ws.root / "var" / "prometheus").is_dir()
    # the burst and the failed node of the README reach the fleet
    state = requests.get(f"{ws.url(9400)}/api/v1/state", timeout=5).json()
    assert any(n["name"] == "node-0" and n["state"] != "up" for n in state["nodes"]), state
    assert state["queue"]["default"] > 10, state["queue"]  # what scale-out-on-queue waits for
