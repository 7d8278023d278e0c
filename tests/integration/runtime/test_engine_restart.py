"""Durable state: a SIGKILLed engine neither forgets a pending `for` nor fires twice.

The engine runs as a real process (`gpuops engine run`) against a real Prometheus; its action
goes through the `fleet` executor to a recording HTTP server on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuops.sources.promproc import PrometheusServer, free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

FOR_S = 12  # long enough that a slow restart (< 12 s) still tells the original deadline apart

RULES = f"""
groups:
  - name: restart
    interval: 1s
    rules:
      - policy: always-true
        expr: label_replace(vector(1), "pool", "default", "", "")
        for: {FOR_S}s
        target: [pool]
        action: {{type: scale_out, executor: fleet, params: {{nodes: 1}}}}
        mode: enforce
"""


class Recorder(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.calls: list[tuple[float, dict[str, Any]]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.calls.append((time.time(), body))
        payload = json.dumps({"changed": {"added": ["node-x"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class EngineProcess:
    def __init__(self, config: Path, metrics_port: int, log: Path) -> None:
        self.config = config
        self.metrics_port = metrics_port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        gpuops = Path(sys.executable).parent / "gpuops"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(gpuops), "engine", "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def evaluations(self) -> float:
        try:
            text = requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=1).text
        except requests.RequestException:
            return 0.0
        for line in text.splitlines():
            if line.startswith("gpuops_engine_evaluations_total{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[EngineProcess, Recorder, Path]]:
    recorder = Recorder()
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    prom = PrometheusServer(tmp_path / "prom", "global: {scrape_interval: 15s}\n")
    prom.start()
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "restart.yaml").write_text(RULES)
    metrics_port = free_port()
    config = tmp_path / "engine.yaml"
    config.write_text(
        json.dumps(
            {
                "prometheus": {"url": prom.url, "timeout": "2s"},
                "rules": ["rules"],
                "state_file": "state.sqlite",
                "audit": {"spool_dir": "audit"},
                "executors": {"fleet": {"url": recorder.url}},
                "metrics_listen": f"127.0.0.1:{metrics_port}",
            }
        )
    )
    engine = EngineProcess(config, metrics_port, tmp_path / "engine.log")
    try:
        yield engine, recorder, tmp_path / "state.sqlite"
    finally:
        engine.stop()
        prom.stop()
        recorder.shutdown()
        recorder.server_close()
        thread.join(timeout=5)


def pending_since(state_file: Path) -> float | None:
    if not state_file.exists():
        return None
    db = sqlite3.connect(f"file:{state_file}?mode=ro", uri=True)
    try:
        row = db.execute(
            "SELECT data FROM policy_targets WHERE policy = 'always-true'"
        ).fetchone()  # one row per target
    except sqlite3.OperationalError:
        return None
    finally:
        db.close()
    if not row:
        return None
    return float(json.loads(row[0])["active_since"])


def test_sigkill_during_for_fires_once_at_the_original_deadline(setup) -> None:
    engine, recorder, state_file = setup
    engine.start()
    since = wait_for(lambda: pending_since(state_file), 30, "the target to become pending")
    wait_for(lambda: engine.evaluations() >= 3, 30, "three evaluations")
    assert not recorder.calls
    engine.kill()

    restarted_at = time.time()
    engine.start()
    wait_for(
        lambda: engine.evaluations() >= 1 or recorder.calls, 60, "the restarted engine evaluating"
    )
    evaluating_at = time.time()  # its first evaluation came no later than this
    wait_for(lambda: recorder.calls, 60, "the action after the restart")
    fired_at, body = recorder.calls[0]
    # the timer survived the restart: the episode that fired is the one begun before the kill
    # (a reset timer would store a start after the restart) ...
    assert pending_since(state_file) == since < restarted_at
    # ... and it fired at the original deadline, not `for` seconds after the restarted engine
    # began evaluating (however slow that start was on a loaded machine)
    assert since + FOR_S <= fired_at < evaluating_at + FOR_S
    before = engine.evaluations()
    wait_for(lambda: engine.evaluations() >= before + 3, 30, "three more evaluations")
    assert len(recorder.calls) == 1, recorder.calls
    assert body["nodes"] == 1 and body["decision_id"]


def test_sigkill_after_the_action_does_not_fire_again(setup) -> None:
    engine, recorder, state_file = setup
    engine.start()
    wait_for(lambda: recorder.calls, 60, "the action")
    engine.kill()

    engine.start()
    wait_for(lambda: engine.evaluations() >= 3, 30, "three evaluations after the restart")
    # killed between the executor's call and the recorded outcome, the engine resumes the
    # decision it recorded as started, with the same id (executors deduplicate on it): the
    # action is decided once, never fired again under a new decision
    ids = {body["decision_id"] for _, body in recorder.calls}
    assert len(ids) == 1, recorder.calls
