"""Batch operations run by the engine itself (``gpuops engine run``), started and resumed
through its API (``gpuops batch run|resume --url``), on 50 nodes of the simulated fleet drained
and returned through the ``fleet`` executor: a canary of 2, ``max_unavailable: 10%``; a node
whose step fails is skipped and reported, a validation failure on a second pauses the operation
at its threshold, resume goes on, the engine SIGKILLed mid-rollout and started again goes on by
itself without redoing a finished step or leaving a node drained; never more than 5 nodes out
of service, from the fleet's own record (each of its topology changes) and from the audit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from click.testing import CliRunner

from gpuops.api.tokens import hash_token
from gpuops.audit.spool import read_spool
from gpuops.cli import cli
from gpuops.sim.fleet import FleetSim
from gpuops.sim.fleet import operations as fleet_ops
from gpuops.sim.fleet.config import FleetConfig, PoolSpec
from gpuops.sources.promproc import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "batch-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODES = [f"node-{i}" for i in range(50)]
DRAINED, DOWN = "node-16", "node-32"  # out of service before the operation
FAILS_STEP, FAILS_VALIDATION = "node-9", "node-29"

STEP = f"""\
import os, sys, time
node, folder, what = sys.argv[1], sys.argv[2], sys.argv[3]
with open(os.path.join(folder, node), "a") as out:
    out.write(what + " " + os.environ["GPUOPS_DECISION_ID"] + "\\n")
if what == "step":
    time.sleep(0.15)
failed = (what, node) in (("step", "{FAILS_STEP}"), ("validate", "{FAILS_VALIDATION}"))
sys.exit(3 if failed else 0)
"""


class FleetRecord:
    """The simulated fleet's own record: at each of its topology changes (a drain, a return,
    a failure) the nodes out of service just after it, and the nodes file the engine plans
    over (``batch.nodes``), written whole from the fleet's state."""

    STATES = {"up": "up", "drained": "drained", "failed": "down", "booting": "down"}

    def __init__(self, sim: FleetSim, nodes_file: Path) -> None:
        self.sim = sim
        self.file = nodes_file
        self.changes: list[tuple[float, int]] = []
        self.lock = threading.Lock()
        owner = sim.cluster.on_topology

        def changed() -> None:
            if owner is not None:
                owner()
            self.write()

        sim.cluster.on_topology = changed
        self.write()

    def states(self) -> dict[str, str]:
        with self.sim.cluster.lock:
            return {n.name: n.state for n in self.sim.cluster.nodes.values()}

    def write(self) -> None:
        with self.sim.cluster.lock:
            nodes = [
                {"name": n.name, "pool": n.pool, "gpus": len(n.gpus), "state": n.state}
                for n in self.sim.cluster.nodes.values()
            ]
        with self.lock:
            self.changes.append((time.time(), sum(1 for n in nodes if n["state"] != "up")))
            for node in nodes:
                node["state"] = self.STATES[str(node["state"])]
            part = self.file.with_suffix(".part")
            part.write_text(yaml.safe_dump({"nodes": nodes}))
            os.replace(part, self.file)


class EngineProcess:
    """``gpuops engine run`` on the test's configuration, its API at ``url``."""

    def __init__(self, tmp: Path, config: Path, url: str) -> None:
        self.url = url
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        main = "from gpuops.cli import main; main()"
        with open(tmp / "engine.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", main, "engine", "run", "--config", str(config)],
                cwd=tmp,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._serving, timeout=60, what="the engine's API")

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


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, FleetRecord, str]]:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "none.yaml").write_text("groups: []\n")  # batch operations only
    (tmp_path / "tokens.yaml").write_text(
        f"users: [{{name: alice, roles: [admin], token_sha256: {hash_token(TOKEN)}}}]\n"
    )
    config = FleetConfig(
        pools=(PoolSpec("a100", nodes=50, gpus_per_node=8),),
        arrival_rate_per_min=0.0,
        initial_jobs=(),
        sd_file=str(tmp_path / "gpu-nodes.json"),
    )
    with FleetSim(config) as sim:
        record = FleetRecord(sim, tmp_path / "nodes.yaml")
        fleet_ops.migrate(sim.cluster, DRAINED)  # an admin's drain
        fleet_ops.fail(sim.cluster, DOWN)
        url = f"http://127.0.0.1:{free_port()}"
        engine = tmp_path / "engine.yaml"
        engine.write_text(
            "rules: [rules]\nmetrics_listen: null\nstate_file: state.sqlite\n"
            "audit: {spool_dir: audit}\n"
            f"api: {{listen: '{url.removeprefix('http://')}', tokens_file: tokens.yaml}}\n"
            f"executors: {{fleet: {{url: '{sim.control_url}'}}}}\n"
            "batch: {nodes: nodes.yaml}\n"
        )
        yield engine, record, url


def operation(tmp: Path) -> Path:
    (tmp / "step.py").write_text(STEP)
    (tmp / "calls").mkdir()
    command = f"[{sys.executable}, {tmp}/step.py, '{{{{ $labels.node }}}}', {tmp}/calls"
    op = tmp / "driver-550.operation.yaml"
    op.write_text(
        "operation: driver-550\n"
        "targets: {pool: a100, all: true}\n"
        "quarantine: fleet\n"
        f"step: {{command: {command}, step]}}\n"
        f"validate: {{command: {command}, validate]}}\n"
        "canary: 2\nmax_parallel: 5\nmax_unavailable: 10%\nfailure_threshold: 2\n"
        "enforce: true\n"
    )
    return op


def gpuops(*args: str, url: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["batch", *args, "--url", url, "--token", TOKEN])
    return result.exit_code, result.stdout  # stderr: the simulated fleet's log lines too


def calls(tmp: Path) -> dict[str, list[tuple[str, str]]]:
    """Each node's step and validation runs, in order: (what, decision id)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((tmp / "calls").iterdir()):
        pairs = [line.split() for line in path.read_text().splitlines()]
        out[path.name] = [(what, ident) for what, ident in pairs]
    return out


def audited(spool: Path) -> list[tuple[float, str, str, str, dict[str, Any] | None]]:
    """The operation's audit documents: (written at, node, action, decision id, outcome)."""
    found = []
    for doc in read_spool(spool):
        if not str(doc.get("rule", {}).get("name", "")).startswith("batch/"):
            continue
        at = datetime.fromisoformat(doc["event"]["created"]).timestamp()
        action = (doc["gpuops"].get("action") or {}).get("type", "")
        decision = doc["gpuops"]["decision"]["id"]
        found.append((at, doc["labels"]["node"], action, decision, doc["gpuops"].get("outcome")))
    return found


def out_of_service_from_audit(
    docs: list[tuple[float, str, str, str, dict[str, Any] | None]], before: set[str]
) -> tuple[int, int]:
    """The most nodes out of service at once by the audit, and the drains it holds: a node
    goes out when its drain's intent is written (before it runs) and comes back when its
    return's outcome is written (after it ran); ``before``: those out already."""
    moves = []
    for at, node, action, _, outcome in docs:
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
    setup: tuple[Path, FleetRecord, str],
) -> None:
    config, fleet, url = setup
    tmp = config.parent
    op = operation(tmp)
    first = time.time()
    started_at = time.monotonic()
    engine = EngineProcess(tmp, config, url)
    try:
        code, said = gpuops("run", str(op), "--wait", url=url)
        assert code == 1, said  # paused
        batch = said.split()[1]
        assert said.splitlines()[1].startswith(
            f"batch {batch}: paused (failure threshold 2 reached:"
            f" {FAILS_VALIDATION}, {FAILS_STEP} failed);"  # by name
        )
        assert f"  {FAILS_STEP}: failed: step: command " in said and "exited 3" in said
        assert f"  {FAILS_VALIDATION}: failed: validate: command " in said
        assert f"  {DOWN}: skipped: down" in said
        paused = engine.batch(batch)
        assert [n for n in paused["nodes"] if n["status"] == "pending"], "paused too late"

        marks = {"paused": time.time()}
        code, said = gpuops("resume", batch, url=url)
        assert code == 0 and said == f"batch {batch} resumed: the engine runs it\n"
        validated = len(calls(tmp))
        wait_for(lambda: len(calls(tmp)) >= validated + 6, timeout=60, what="6 more nodes")
        engine.kill()
        marks["killed"] = time.time()
        assert engine.proc.returncode == -signal.SIGKILL
        # what the killed engine had stored: read in this process, as no engine runs
        args = ["batch", "status", batch, "--config", str(config), "--json"]
        [killed] = json.loads(CliRunner().invoke(cli, args).stdout)
        assert killed["status"] == "running"
        finished = {n["name"] for n in killed["nodes"] if n["status"] == "done"}
        assert finished and len(finished) < 47, "the rollout ended before the kill"

        engine = EngineProcess(tmp, config, url)  # goes on by itself
        marks["restarted"] = time.time()
        wait_for(lambda: engine.batch(batch)["status"] != "running", timeout=60, what="the end")
        done = engine.batch(batch)
    finally:
        engine.stop()
    wall = time.monotonic() - started_at

    assert (done["status"], done["why"]) == ("done", f"failed: {FAILS_VALIDATION}, {FAILS_STEP}")
    out = {n: s for n, s in fleet.states().items() if s != "up"}
    assert out == {
        DRAINED: "drained",  # drained before: stays so
        DOWN: "failed",
        FAILS_STEP: "drained",  # failed: left out of service, reported
        FAILS_VALIDATION: "drained",
    }

    # no finished node again, no finished step again: each node's steps once, in order; a
    # step the kill interrupted (run, not yet stored as done) once more, with the same id
    docs = audited(tmp / "audit")
    again = 0
    for node, runs in calls(tmp).items():
        ids: dict[str, str] = {}
        for what, ident in runs:
            assert ids.setdefault(what, ident) == ident, f"{node}: {what} as two decisions"
        kinds = [what for what, _ in runs]
        repeated = len(kinds) - len(set(kinds))
        assert repeated <= 1, f"{node} ran {kinds}"
        again += repeated
    for at, node, action, _, _ in docs:
        assert node not in finished or at < marks["killed"], f"{node}: {action} after the kill"
    for node in set(NODES) - {DOWN}:  # one drain and one return decision each, at most
        for action in ("migrate", "resume"):
            assert len({d for _, n, a, d, _ in docs if (n, a) == (node, action)}) <= 1
    assert again <= 5  # at most the steps running at the kill

    # never more than 10 % of 50 out of service: the fleet's own record and the audit
    assert max(out for _, out in fleet.changes) <= 5
    most, drains = out_of_service_from_audit(docs, {DRAINED, DOWN})
    assert most <= 5 and drains >= 49  # every node drained but the down one, some twice
    timeline = done["timeline"]
    assert timeline[0][2] == 4  # the canary: 2 out before, 2 more
    assert max(u for _, _, u in timeline) <= 5

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
    print("  out of service over time (the fleet's record, each change):")
    print("  " + " ".join(f"{at - first:.1f}s:{out}" for at, out in fleet.changes))
