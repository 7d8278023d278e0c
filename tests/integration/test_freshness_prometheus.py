"""Fresh data only (issue 10, breakage 1) against a real Prometheus: SIGKILLed, restarted on
the same TSDB while its target does not answer, it serves the samples it had (a killed
Prometheus writes no staleness markers). An engine with the default freshness bounds acts on
none of them and acts again once the data is fresh; one without bounds (the engine before
issue 10) fires on the stale samples, which shows the scenario reproduces the breakage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from engine.actions.base import ExecutorRegistry
from engine.config import AuditConfig, EngineConfig, PrometheusSettings
from engine.decisions import Decision
from engine.promproc import PrometheusServer
from engine.runtime import Engine
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

RULES = """
groups:
  - name: freshness
    interval: 1s
    rules:
      - policy: reclaim-now
        expr: gpu_util < 0.2
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
      - policy: reclaim-after
        expr: gpu_util < 0.2
        for: 4s
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
"""
SCRAPE_S = 1.0


class Exporter(ThreadingHTTPServer):
    """Serves ``gpu_util`` at ``value``; answers 503 while ``down`` (a failed scrape)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.value = 0.1
        self.down = False
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Exporter

    def do_GET(self) -> None:
        if self.server.down:
            self.send_error(503)
            return
        body = f'gpu_util{{uuid="GPU-1"}} {self.server.value}\n'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Recording:
    name = "log"
    verbs = None

    def __init__(self, ran: list[Decision]) -> None:
        self.ran = ran

    def run(self, decision: Decision) -> Mapping[str, Any]:
        self.ran.append(decision)
        return {"logged": True}


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    server = Exporter()
    yield server
    server.shutdown()
    server.server_close()


def _sample(url: str) -> tuple[float, float] | None:
    """(value, sample time) of gpu_util as Prometheus serves it now; None: none."""
    try:
        found = []
        for query in ("gpu_util", "timestamp(gpu_util)"):
            got = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=2)
            (series,) = got.json()["data"]["result"]
            found.append(float(series["value"][1]))
        return found[0], found[1]
    except (requests.RequestException, ValueError, KeyError, IndexError):
        return None


def _engine(tmp_path: Path, name: str, url: str, ran: list[Decision], **bounds: float) -> Engine:
    registry = ExecutorRegistry()
    registry.register("log", lambda settings: Recording(ran))
    config = EngineConfig(
        prometheus=PrometheusSettings(url=url, timeout=2.0, scrape_interval=SCRAPE_S, **bounds),
        rules=[tmp_path / "rules.yaml"],
        state_file=tmp_path / f"{name}.sqlite",
        audit=AuditConfig(spool_dir=tmp_path / f"audit-{name}"),
        metrics_listen=None,
    )
    engine = Engine(config, executors=registry)
    engine.reload(strict=True)
    return engine


def _cycle(*engines: Engine) -> list[Decision]:
    decided = []
    for engine in engines:
        for policy in engine.rules.policies():
            decided += engine.evaluate_policy(policy, time.time())
        assert engine.wait_idle(10)
    return decided


def test_a_restarted_prometheus_serving_old_samples_gets_no_action(
    tmp_path: Path, exporter: Exporter
) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    config = (
        f"global: {{scrape_interval: {SCRAPE_S:g}s, evaluation_interval: 1m}}\n"
        "scrape_configs:\n  - job_name: gpus\n"
        f"    static_configs: [{{targets: ['{exporter.address}']}}]\n"
    )
    prom = PrometheusServer(tmp_path / "prometheus", config)
    prom.start()
    ran: list[Decision] = []  # the engine as it is
    unbounded: list[Decision] = []  # the engine before issue 10: no freshness bounds
    engine = _engine(tmp_path, "fresh", prom.url, ran)
    before = _engine(
        tmp_path, "before", prom.url, unbounded, max_sample_age=1e9, max_pending_gap=1e9
    )
    try:
        wait_for(lambda: _sample(prom.url), 30, "Prometheus to scrape gpu_util")
        # only the `for: 4s` policy has seen the condition before the outage (pending)
        for e in (engine, before):
            pending = e.rules.policy("reclaim-after")
            assert pending is not None and e.evaluate_policy(pending, time.time()) == []

        assert prom.proc is not None
        prom.proc.kill()  # SIGKILL: no staleness markers, the WAL keeps the samples
        prom.proc.wait()
        exporter.down, exporter.value = True, 0.9  # the GPU is busy now; nobody scrapes it
        assert _cycle(engine, before) == []  # refused connections: skipped evaluations
        scraped_at = time.time()
        wait_for(lambda: time.time() - scraped_at > 4 * SCRAPE_S + 1, 10, "the outage to last")

        prom = PrometheusServer(tmp_path / "prometheus", config, port=prom.port)
        prom.start()  # same TSDB; its scrapes fail, so the old sample stays in the results
        old = wait_for(lambda: _sample(prom.url), 30, "the restarted Prometheus to answer")
        assert old[0] == 0.1 and time.time() - old[1] > 2 * SCRAPE_S  # old and stale

        assert _cycle(engine) == [] and ran == []  # 0 actions on stale data
        _cycle(before)
        assert sorted(d.policy for d in unbounded) == ["reclaim-after", "reclaim-now"]

        exporter.down = False  # the target answers again: 0.9, fresh
        wait_for(lambda: (s := _sample(prom.url)) and s[0] == 0.9, 30, "a fresh 0.9")
        assert _cycle(engine) == [] and ran == []
        exporter.value = 0.1  # idle again, freshly scraped: now it may act
        wait_for(lambda: (s := _sample(prom.url)) and s[0] == 0.1, 30, "a fresh 0.1")
        _cycle(engine)
        # the outage did not count towards `for: 4s`: only the `for: 0s` policy fires yet
        assert [d.policy for d in ran] == ["reclaim-now"]
    finally:
        engine.stop()
        before.stop()
        prom.stop()
