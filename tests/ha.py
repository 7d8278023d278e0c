"""Two ``gpuops engine run`` replicas on one PostgreSQL and one Prometheus, for the takeover
tests (tests/integration/runtime/test_ha_takeover.py) and the benchmark
(tests/benchmarks/bench_ha.py).

Each replica reaches PostgreSQL through its own loopback TCP proxy, which can cut its
connections and refuse new ones (a network partition between that replica and the database).
The action of the one policy (``repeat_interval: 1s``: a new decision every second) goes through
the ``fleet`` executor to ``Recorder``, which counts deliveries by decision id and can hold its
answers (an action in flight).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import requests

from gpuops.audit.spool import read_spool
from gpuops.sources.promproc import free_port
from tests.postgres import PASSWORD, PostgresServer
from tests.waiting import wait_for

RULES = """
groups:
  - name: ha
    interval: 1s
    rules:
      - policy: always
        expr: label_replace(vector(1), "pool", "default", "", "")
        target: [pool]
        repeat_interval: 1s
        action: {type: scale_out, executor: fleet, params: {nodes: 1}}
        mode: enforce
"""

TOKEN = "test"
"""An admin's token (its sha256 is in ``USERS``)."""
USERS = (
    "users: [{name: ops, roles: [admin],"
    " token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]"
)


class Recorder(ThreadingHTTPServer):
    """The executor's far end: every delivery's decision id, in order; ``hold`` keeps answers
    back until ``release``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ids: list[str] = []
        self.lock = threading.Lock()
        self.held = threading.Event()
        self.held.set()  # set: answer at once

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def deliveries(self) -> Counter[str]:
        with self.lock:
            return Counter(self.ids)

    def count(self) -> int:
        with self.lock:
            return len(self.ids)

    def hold(self) -> None:
        self.held.clear()

    def release(self) -> None:
        self.held.set()


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.ids.append(str(body.get("decision_id")))
        self.server.held.wait(60)
        payload = json.dumps({"changed": {"added": ["node-x"]}}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the engine that asked was killed meanwhile
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Proxy:
    """A loopback TCP proxy to ``port``; ``cut`` drops its connections and refuses new ones
    until ``heal``."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.open = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open = False
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def heal(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.sock.close()


class Replica:
    """One ``gpuops engine run`` process with its own spool, API port and proxy."""

    def __init__(self, name: str, root: Path, pg: PostgresServer, db: str, **common: Any) -> None:
        self.name = name
        self.proxy = Proxy(pg.port)
        self.api_port = free_port()
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "engine.yaml"
        self.log = self.dir / "engine.log"
        url = f"postgresql://postgres@127.0.0.1:{self.proxy.port}/{db}"
        state = dict(common.pop("state"))
        state.update(url=url, replica=name, advertise_url=self.url)
        config = {
            **common,
            "state": state,
            "audit": {"spool_dir": str(self.dir / "audit")},
            "metrics_listen": None,
            "api": {"listen": f"127.0.0.1:{self.api_port}"},
        }
        self.config.write_text(json.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> None:
        gpuops = Path(sys.executable).parent / "gpuops"
        env = {**os.environ, "GPUOPS_API_TOKENS": USERS}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(gpuops), "engine", "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def health(self) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = requests.get(self.url + "/healthz", timeout=1).json()
            return body
        except (requests.RequestException, ValueError):
            return None

    def role(self) -> str | None:
        health = self.health()
        return None if health is None else str(health["leadership"]["role"])

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(timeout=10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()

    def stop(self) -> None:
        self.terminate()
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proxy.close()


class Pair:
    """Two replicas, the recorder and the database they share."""

    def __init__(
        self,
        root: Path,
        pg: PostgresServer,
        prometheus_url: str,
        lease: float,
        renew: float,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """``extra``: more of both replicas' configuration (``batch``...)."""
        self.pg = pg
        self.recorder = Recorder()
        threading.Thread(target=self.recorder.serve_forever, daemon=True).start()
        db = f"ha_{os.getpid()}_{int(time.monotonic() * 1000) % 100000}"
        pg.database(db)
        self.dsn = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{pg.port}/{db}"
        (root / "rules").mkdir(parents=True, exist_ok=True)
        (root / "rules" / "ha.yaml").write_text(RULES)
        common = {
            "prometheus": {"url": prometheus_url, "timeout": "2s"},
            "rules": [str(root / "rules")],
            "executors": {"fleet": {"url": self.recorder.url, "timeout_s": 120}},
            "state": {
                "password_file": str(pg.password_file),
                "lease": lease,
                "renew_interval": renew,
            },
            **(extra or {}),
        }
        self.replicas = [Replica(n, root, pg, db, **json.loads(json.dumps(common))) for n in "ab"]

    def start(self) -> Replica:
        for replica in self.replicas:
            replica.start()

        def leader() -> Replica | None:
            for replica in self.replicas:
                if not replica.alive():
                    tail = replica.log.read_text(errors="replace")[-2000:]
                    raise AssertionError(f"replica {replica.name} exited: {tail}")
            return self.leader()

        elected: Replica = wait_for(leader, 60, "a leader")
        standby = self.other(elected)
        wait_for(lambda: standby.role() == "standby", 60, f"{standby.name} as the standby")
        return elected

    def leader(self) -> Replica | None:
        for replica in self.replicas:
            if replica.alive() and replica.role() == "leader":
                return replica
        return None

    def other(self, replica: Replica) -> Replica:
        return next(r for r in self.replicas if r is not replica)

    def takeover(self, old: Replica, timeout: float = 60) -> tuple[Replica, float]:
        """Wait for the other replica to lead; (it, seconds since this call)."""
        start = time.monotonic()
        new = self.other(old)
        wait_for(lambda: new.role() == "leader", timeout, f"{new.name} to take over")
        return new, time.monotonic() - start

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(sql, args).fetchall()

    def started(self) -> set[str]:
        return {r[0] for r in self.rows("SELECT id FROM decisions WHERE status = 'started'")}

    def executed(self, done: bool = False) -> set[str]:
        """Decisions recorded to run (``verdict = execute``): whatever their status, or
        (``done``) only those whose outcome is stored."""
        sql = "SELECT id FROM decisions WHERE verdict = 'execute'"
        return {r[0] for r in self.rows(sql + (" AND status = 'done'" if done else ""))}

    def audit(self) -> dict[str, dict[str, set[str]]]:
        """Per decision id, per ``event.outcome``, the event ids in the replicas' spools."""
        found: dict[str, dict[str, set[str]]] = {}
        for replica in self.replicas:
            for doc in read_spool(replica.dir / "audit"):
                decision = doc.get("gpuops", {}).get("decision", {}).get("id")
                if decision:
                    outcome = str(doc["event"]["outcome"])
                    found.setdefault(decision, {}).setdefault(outcome, set()).add(
                        doc["event"]["id"]
                    )
        return found

    def elections(self) -> list[int]:
        """The epochs of the ``leadership.elected`` documents in the replicas' spools."""
        return sorted(
            doc["gpuops"]["leadership"]["epoch"]
            for replica in self.replicas
            for doc in read_spool(replica.dir / "audit")
            if doc["event"].get("action") == "leadership.elected"
        )

    def settled(self, timeout: float = 60) -> None:
        """Wait until no recorded action is unfinished."""
        wait_for(lambda: not self.started(), timeout, "every started action to finish")

    def stop(self) -> None:
        for replica in self.replicas:
            replica.terminate()  # both at once: their stops overlap
        for replica in self.replicas:
            replica.stop()
        self.recorder.release()
        self.recorder.shutdown()
        self.recorder.server_close()
