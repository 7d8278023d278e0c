"""Batch operations run by the engine itself, started and resumed through its API (``gpuops
batch run|resume --url``): 50 nodes, a canary of 2, ``max_unavailable: 10%``; a node whose step
fails is skipped and reported, a validation failure on a second pauses the operation at its
threshold, resume goes on, the engine SIGKILLed mid-rollout and started again goes on by itself
without redoing a finished step or leaving a node drained; never more than 5 nodes out of
service, from the fleet's own record and from the audit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from gpuops.api.tokens import hash_token
from gpuops.audit.spool import read_spool
from gpuops.cli import cli
from gpuops.sources.promproc import free_port
from tests.fakes.rollout_fleet import FileFleet
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "batch-admin-token"
NODES = [f"gpu-{i:03d}" for i in range(1, 51)]

STEP = """\
import os, sys, time
node, folder, what = sys.argv[1], sys.argv[2], sys.argv[3]
with open(os.path.join(folder, "calls", node), "a") as out:
    out.write(what + " " + os.environ["GPUOPS_DECISION_ID"] + "\\n")
if what == "step":
    time.sleep(0.15)
failed = (what, node) in (("step", "gpu-010"), ("validate", "gpu-030"))
sys.exit(3 if failed else 0)
"""


def operation(tmp: Path, fleet: Path) -> Path:
    (tmp / "step.py").write_text(STEP)
    command = f"[{sys.executable}, {tmp}/step.py, '{{{{ $labels.node }}}}', {fleet}"
    op = tmp / "driver-550.operation.yaml"
    op.write_text(
        "operation: driver-550\n"
        "targets: {pool: a100, all: true}\n"
        "quarantine: rollout-fleet\n"
        f"step: {{command: {command}, step]}}\n"
        f"validate: {{command: {command}, validate]}}\n"
        "canary: 2\nmax_parallel: 5\nmax_unavailable: 10%\nfailure_threshold: 2\n"
        "enforce: true\n"
    )
    return op


class EngineProcess:
    """``python -m tests.fakes.rollout_fleet`` on the test's configuration, its API at ``url``."""

    def __init__(self, tmp: Path, config: Path, url: str) -> None:
        self.url = url
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(tmp / "engine.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fakes.rollout_fleet", str(config)],
                cwd=tmp,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._serving, timeout=30, what="the engine's API")

    def _serving(self) -> bool:
        assert self.proc.poll() is None, "the engine exited"
        try:
            return requests.get(f"{self.url}/api/v1/batch", headers=AUTH, timeout=2).ok
        except requests.ConnectionError:
            return False

    def batch(self, batch_id: str) -> dict[str, Any]:
        answer = requests.get(f"{self.url}/api/v1/batch/{batch_id}", headers=AUTH, timeout=5)
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, FileFleet, str]]:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "none.yaml").write_text("groups: []\n")  # batch operations only
    fleet = FileFleet(tmp_path / "fleet")
    fleet.create(NODES, drained=["gpu-017"], down=["gpu-033"])
    (tmp_path / "tokens.yaml").write_text(
        f"users: [{{name: alice, roles: [admin], token_sha256: {hash_token(TOKEN)}}}]\n"
    )
    url = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "engine.yaml"
    config.write_text(
        "rules: [rules]\nmetrics_listen: null\nstate_file: state.sqlite\n"
        "audit: {spool_dir: audit}\n"
        f"api: {{listen: '{url.removeprefix('http://')}', tokens_file: tokens.yaml}}\n"
        f"executors: {{rollout-fleet: {{dir: {fleet.folder}}}}}\n"
        "batch: {nodes: fleet/nodes.yaml}\n"
    )
    yield config, fleet, url


def gpuops(*args: str, url: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["batch", *args, "--url", url, "--token", TOKEN])
    return result.exit_code, result.output


def returned_nodes(fleet: FileFleet) -> list[str]:
    return [n for n, calls in fleet.calls().items() if calls and calls[-1][0] == "resume"]


def out_of_service_from_audit(spool: Path, before: set[str]) -> tuple[int, int]:
    """The most nodes out of service at once by the audit, and the drains it holds: a node
    goes out when its drain's intent is written (before it runs) and comes back when its
    return's outcome is written (after it ran); ``before``: those out already."""
    moves: list[tuple[float, int, str]] = []
    for doc in read_spool(spool):
        if not str(doc.get("rule", {}).get("name", "")).startswith("batch/"):
            continue
        action = (doc["gpuops"].get("action") or {}).get("type")
        outcome = doc["gpuops"].get("outcome")
        at = datetime.fromisoformat(doc["event"]["created"]).timestamp()
        node = doc["labels"]["node"]
        if action == "migrate" and outcome is None:
            moves.append((at, 0, node))  # at the same instant, out before back
        elif action == "resume" and outcome is not None and outcome["status"] == "success":
            moves.append((at, 1, node))
    out = set(before)
    most = len(out)
    for _, back, node in sorted(moves):
        if back:
            out.discard(node)
        else:
            out.add(node)
        most = max(most, len(out))
    return most, sum(1 for _, back, _ in moves if not back)


def test_fifty_nodes_hosted_failures_resume_and_sigkill(
    setup: tuple[Path, FileFleet, str],
) -> None:
    config, fleet, url = setup
    tmp = config.parent
    op = operation(tmp, fleet.folder)
    started_at = time.monotonic()
    engine = EngineProcess(tmp, config, url)
    try:
        code, said = gpuops("run", str(op), "--wait", url=url)
        assert code == 1, said  # paused
        batch = said.split()[1]
        assert said.splitlines()[1].startswith(
            f"batch {batch}: paused (failure threshold 2 reached: gpu-010, gpu-030 failed);"
        )
        assert "  gpu-010: failed: step: command " in said and "exited 3" in said
        assert "  gpu-030: failed: validate: command " in said
        assert "  gpu-033: skipped: down" in said
        paused = engine.batch(batch)
        untouched = [n["name"] for n in paused["nodes"] if n["status"] == "pending"]
        assert untouched, "the threshold paused it before every node went"

        marks = {"paused": time.time()}
        code, said = gpuops("resume", batch, url=url)
        assert code == 0 and said == f"batch {batch} resumed: the engine runs it\n"
        returned = len(returned_nodes(fleet))
        wait_for(
            lambda: len(returned_nodes(fleet)) >= returned + 6, timeout=60, what="6 more nodes"
        )
        engine.kill()
        marks["killed"] = time.time()
        before_kill = fleet.calls()
        assert len(returned_nodes(fleet)) < 46, "the rollout ended before the kill"
        # what the killed engine had stored: read in this process, as no engine runs
        args = ["batch", "status", batch, "--config", str(config), "--json"]
        [killed] = json.loads(CliRunner().invoke(cli, args).stdout)
        assert killed["status"] == "running"
        finished = {n["name"] for n in killed["nodes"] if n["status"] == "done"}
        assert finished
        assert engine.proc.returncode == -signal.SIGKILL

        engine = EngineProcess(tmp, config, url)  # goes on by itself
        marks["restarted"] = time.time()
        wait_for(lambda: engine.batch(batch)["status"] != "running", timeout=60, what="the end")
        done = engine.batch(batch)
    finally:
        engine.stop()
    wall = time.monotonic() - started_at

    assert (done["status"], done["why"]) == ("done", "failed: gpu-010, gpu-030")
    state = fleet.state()
    out = {n: s["state"] for n, s in state.items() if s["state"] != "up"}
    assert out == {
        "gpu-017": "drained",  # drained before: stays so
        "gpu-033": "down",
        "gpu-010": "drained",  # failed: left out of service, reported
        "gpu-030": "drained",
    }
    assert {n for n, s in state.items() if s["ours"]} == {"gpu-010", "gpu-030"}

    # no finished node again, no finished step again: each node's steps once, in order; a
    # step the kill interrupted (run, not yet stored as done) once more, with the same id
    after = fleet.calls()
    again = 0
    for node, calls in after.items():
        ids: dict[str, str] = {}
        for what, ident in calls:
            assert ids.setdefault(what, ident) == ident, f"{node}: {what} as two decisions"
        kinds = [what for what, _ in calls]
        repeated = len(kinds) - len(set(kinds))
        assert repeated <= 1, f"{node} ran {kinds}"
        again += repeated
        if node in finished:
            assert calls == before_kill[node], f"{node} finished before the kill, ran again"
    assert again <= 5  # at most the steps running at the kill

    # never more than 10 % of 50 out of service: the fleet's record and the audit
    events = fleet.events()
    assert max(e["out"] for e in events) <= 5
    most, drains = out_of_service_from_audit(tmp / "audit", {"gpu-017", "gpu-033"})
    assert most <= 5 and drains >= 47  # every node drained but gpu-033 (down), some twice
    timeline = done["timeline"]
    assert timeline[0][2] == 4  # the canary: 2 out before, 2 more
    assert max(u for _, _, u in timeline) <= 5

    first = events[0]["t"]
    waves: dict[int, int] = {}
    for node in done["nodes"]:
        waves[node["wave"]] = waves.get(node["wave"], 0) + 1
    print(f"\n50-node rollout: {len(timeline)} waves, wall {wall:.1f}s (two engine starts)")
    for name, at in marks.items():
        print(f"  {name} at +{at - first:.1f}s")
    for at, wave, unavailable in timeline:
        print(
            f"  wave {int(wave):2d} at +{at - first:5.1f}s: {waves.get(int(wave), 0)} nodes,"
            f" {int(unavailable)} unavailable"
        )
    print("  out of service over time (fleet record, each change):")
    print("  " + " ".join(f"{e['t'] - first:.1f}s:{e['out']}" for e in events))
