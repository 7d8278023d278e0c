"""Fresh data only against a real Prometheus: SIGKILLed, restarted on
the same TSDB while its target does not answer, it serves the samples it had (a killed
Prometheus writes no staleness markers). An engine with the default freshness bounds acts on
none of them and acts again once the data is fresh; one without bounds fires on the stale
samples, which shows the scenario is one where the bounds matter.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuops.model.decisions import Decision
from gpuops.runtime import Engine
from gpuops.settings import AuditConfig, PrometheusSettings
from gpuops.sources.promproc import PrometheusServer
from tests.builders import build_engine
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
    verbs: frozenset[str] | None = None

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
    return build_engine(
        tmp_path,
        [tmp_path / "rules.yaml"],
        executors={"log": Recording(ran)},
        prometheus=PrometheusSettings(url=url, timeout=2.0, scrape_interval=SCRAPE_S, **bounds),
        state_file=tmp_path / f"{name}.sqlite",
        audit=AuditConfig(spool_dir=tmp_path / f"audit-{name}"),
    )


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
    unbounded: list[Decision] = []  # no freshness bounds
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


EXPORTER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

BODY = sys.argv[2].encode()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

WINDOW_S = 12.0
"""The range of the windowed policies: long enough to outlast the bound many times over."""

SHAPES = f"""
groups:
  - name: shapes
    interval: 1s
    rules:
      - policy: instant
        expr: util < 0.2 and on (uuid) alloc == 1
        target: [node, uuid]
        repeat_interval: 1s
        action: {{type: reclaim, executor: log}}
        mode: enforce
      - policy: max-repeating
        expr: max_over_time(util[{WINDOW_S:g}s]) < 0.2
        target: [node, uuid]
        repeat_interval: 1s
        action: {{type: reclaim, executor: log}}
        mode: enforce
      - policy: avg-for
        expr: avg_over_time(util[{WINDOW_S:g}s]) < 0.2
        for: 4s
        target: [node, uuid]
        action: {{type: reclaim, executor: log}}
        mode: enforce
      - policy: shipped-reclaim
        expr: |
          max_over_time(util[{WINDOW_S:g}s]) < 0.20
            and on (uuid) alloc == 1
            unless on (uuid) shared > 0
        for: 3s
        target: [node, uuid]
        action: {{type: reclaim, executor: log}}
        mode: enforce
"""


class _Process:
    """An exporter in a process of its own, SIGKILLed as a crashed exporter is."""

    def __init__(self, tmp_path: Path, name: str, body: str) -> None:
        from gpuops.sources.promproc import free_port

        script = tmp_path / "exporter.py"
        script.write_text(EXPORTER)
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(script), str(self.port), body])
        self.address = f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def _up(url: str, address: str) -> float | None:
    try:
        got = requests.get(
            f"{url}/api/v1/query", params={"query": f'up{{instance="{address}"}}'}, timeout=2
        )
        (series,) = got.json()["data"]["result"]
        return float(series["value"][1])
    except (requests.RequestException, ValueError, KeyError, IndexError):
        return None


def test_a_dead_exporters_targets_are_held_in_every_window_shape(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two GPUs idle on two nodes, their allocation from a third exporter that stays up.
    The exporter of node n1 is SIGKILLed: while its last samples are still inside the
    windows, no policy acts on its GPU again (the instant selector's series end at once; the
    windowed ones keep answering with its last samples, which the stale-series probe finds),
    a pending ``for`` does not complete on them, and the GPU of n2 is still acted on."""
    (tmp_path / "rules.yaml").write_text(SHAPES)
    n1 = _Process(tmp_path, "n1", 'util{node="n1",uuid="GPU-A"} 0.05\n')
    n2 = _Process(tmp_path, "n2", 'util{node="n2",uuid="GPU-B"} 0.05\n')
    alloc = _Process(
        tmp_path,
        "alloc",
        'alloc{node="n1",uuid="GPU-A"} 1\nalloc{node="n2",uuid="GPU-B"} 1\n'
        'shared{node="n1",uuid="GPU-A"} 0\nshared{node="n2",uuid="GPU-B"} 0\n',
    )
    targets = ", ".join(f"'{p.address}'" for p in (n1, n2, alloc))
    config = (
        f"global: {{scrape_interval: {SCRAPE_S:g}s, evaluation_interval: 1m}}\n"
        "scrape_configs:\n  - job_name: gpus\n"
        f"    static_configs: [{{targets: [{targets}]}}]\n"
    )
    prom = PrometheusServer(tmp_path / "prometheus", config)
    prom.start()
    ran: list[Decision] = []
    engine = _engine(tmp_path, "shapes", prom.url, ran)
    caplog.set_level(logging.WARNING, logger="gpuops.runtime.facade")
    try:
        for p in (n1, n2, alloc):
            wait_for(lambda p=p: _up(prom.url, p.address) == 1, 30, f"{p.address} scraped")
        engine.start()

        def acted(policy: str, uuid: str, after: float = 0.0) -> bool:
            return any(
                d.policy == policy and d.target.labels["uuid"] == uuid and d.at > after
                for d in list(ran)
            )

        # the policies without `for` act on both GPUs; those with `for` are pending
        wait_for(
            lambda: all(acted(p, f"GPU-{u}") for p in ("instant", "max-repeating") for u in "AB"),
            30,
            "the first actions",
        )
        n1.kill()
        killed = time.time()
        assert not acted("avg-for", "GPU-A") and not acted("shipped-reclaim", "GPU-A")
        wait_for(lambda: _up(prom.url, n1.address) == 0, 10, "the failed scrape of n1")
        # the windows still hold n1's last samples until `killed + WINDOW_S`: watch them pass
        wait_for(lambda: time.time() > killed + WINDOW_S, WINDOW_S + 5, "the window to pass")
        assert engine.wait_idle(10)

        grace = killed + 2 * SCRAPE_S + 1.5  # the bound: one missed scrape, one evaluation
        late = sorted(
            f"{d.policy} at +{d.at - killed:.1f}s"
            for d in ran
            if d.target.labels["uuid"] == "GPU-A" and d.at > grace
        )
        assert late == [], late  # nothing acted on the dead exporter's samples
        assert not acted("avg-for", "GPU-A") and not acted("shipped-reclaim", "GPU-A")
        for policy in ("instant", "max-repeating"):  # GPU-B judged as usual all along
            assert acted(policy, "GPU-B", after=killed + WINDOW_S - 2), policy
        assert acted("avg-for", "GPU-B") and acted("shipped-reclaim", "GPU-B")
        held = [
            r.getMessage()
            for r in caplog.records
            if "stale data" in r.getMessage() and "node=n1,uuid=GPU-A" in r.getMessage()
        ]
        assert held, "no stale-data skip was logged for GPU-A"
        assert all("GPU-B" not in m for m in held)
    finally:
        engine.stop()
        prom.stop()
        for p in (n1, n2, alloc):
            if p.proc.poll() is None:
                p.kill()


GAP_RULES = """
groups:
  - name: history
    interval: 1m
    rules:
      - policy: reclaim-idle
        expr: max_over_time(util[10m]) < 0.2 and on (uuid) alloc == 1
        target: [node, uuid]
        repeat_interval: 2m
        action: {type: reclaim, executor: log}
        mode: enforce
"""


def test_a_backtest_holds_a_target_whose_history_has_a_gap(tmp_path: Path) -> None:
    """40 minutes of history scraped every 15 s: GPU-A's exporter stops at minute 15 (its
    allocation still reported), GPU-B's goes on. The backtest acts on GPU-B throughout and on
    GPU-A only while its samples are fresh; without bounds it goes on acting on GPU-A for the
    10 minutes its last samples stay in the window."""
    from click.testing import CliRunner

    from gpuops.cli import cli as gpuops
    from gpuops.model.rules.loader import load_rules_text
    from gpuops.offline.backtest import run_backtest
    from gpuops.sim.fleet.remotewrite import RemoteWriter
    from gpuops.sources.prometheus import PrometheusClient

    config = "global:\n  scrape_interval: 15s\nscrape_configs: []\n"
    with PrometheusServer(
        tmp_path / "prometheus", config, extra_args=["--web.enable-remote-write-receiver"]
    ) as prom:
        start = float(int(time.time() // 60 * 60) - 45 * 60)
        writer = RemoteWriter(prom.url)
        for i in range(40 * 4):
            at = start + 15 * i
            samples = {
                (("__name__", "alloc"), ("node", "n1"), ("uuid", "GPU-A")): 1.0,
                (("__name__", "alloc"), ("node", "n2"), ("uuid", "GPU-B")): 1.0,
                (("__name__", "util"), ("node", "n2"), ("uuid", "GPU-B")): 0.05,
            }
            if at < start + 15 * 60:
                samples[("__name__", "util"), ("node", "n1"), ("uuid", "GPU-A")] = 0.05
            writer.add(int(at * 1000), samples)
        writer.flush()
        client = PrometheusClient(prom.url)
        end = start + 39 * 60
        wait_for(lambda: client.query("alloc", at=end), 20, "the history to be written")

        rules = load_rules_text(GAP_RULES, "history.yaml")
        bounds = PrometheusSettings(scrape_interval=15).freshness(60)

        def acted(freshness: Any) -> dict[str, list[float]]:
            (result,) = run_backtest(
                rules.policies(), client, start + 60, end, 60, freshness=freshness
            ).results
            found: dict[str, list[float]] = {}
            for d in result.decisions:
                if d.transition.value == "fire" and d.verdict == "execute":
                    found.setdefault(d.target.labels["uuid"], []).append((d.at - start) / 60)
            return found

        fresh = acted(lambda p: bounds)
        assert max(fresh["GPU-A"]) < 16  # its last sample at 14:45: nothing after 15:15
        assert max(fresh["GPU-B"]) >= 37  # acted on all along
        unbounded = acted(None)
        assert max(unbounded["GPU-A"]) >= 23  # the window kept the dead series' samples

        (tmp_path / "history.yaml").write_text(GAP_RULES)
        iso = "%Y-%m-%dT%H:%M:%SZ"
        cli = CliRunner().invoke(
            gpuops,
            [
                "backtest", "run", str(tmp_path / "history.yaml"), "--prometheus", prom.url,
                "--start", time.strftime(iso, time.gmtime(start + 60)),
                "--end", time.strftime(iso, time.gmtime(end)),
                "--scrape-interval", "15s", "--json",
            ],
        )  # fmt: skip
        assert cli.exit_code == 0, cli.output
        decided = json.loads(cli.output)["decisions"]
        a = [d["at"] for d in decided if "GPU-A" in d["target"] and d["transition"] == "fire"]
        assert a and max(a) <= time.strftime(iso, time.gmtime(start + 15 * 60 + 30))


def test_the_probe_tells_series_apart_by_name_when_the_selector_has_none(tmp_path: Path) -> None:
    """``{__name__=~"c|d"}``: ``c`` stopped two minutes ago, ``d`` goes on with the same other
    labels. ``unless`` and ``timestamp`` leave the name out, so the probe matches on a copy of
    it: ``c`` is stale, ``d`` is not, read over a window and instantly alike."""
    from gpuops.sim.fleet.remotewrite import RemoteWriter
    from gpuops.sources.prometheus import PrometheusClient
    from gpuops.sources.promql import input_selectors

    config = "global:\n  scrape_interval: 15s\nscrape_configs: []\n"
    with PrometheusServer(
        tmp_path / "prometheus", config, extra_args=["--web.enable-remote-write-receiver"]
    ) as prom:
        now = float(int(time.time()))
        writer = RemoteWriter(prom.url)
        for i in range(40):
            at = now - 600 + 15 * i
            samples = {(("__name__", "d"), ("node", "n1")): 1.0}
            if at <= now - 120:
                samples[("__name__", "c"), ("node", "n1")] = 1.0
            writer.add(int(at * 1000), samples)
        writer.flush()
        client = PrometheusClient(prom.url)
        wait_for(lambda: client.query("d", at=now - 15), 20, "the history to be written")
        windowed = input_selectors('last_over_time({__name__=~"c|d",node="n1"}[10m]) > 0')
        found = client.stale_series(windowed, 30.0, at=now - 15)
        assert [s.labels["gpuops_name"] for s in found[windowed[0]]] == ["c"]
        # an instant one: asked without the name clash timestamp() had (HTTP 422), d fresh
        instant = input_selectors('{__name__=~"c|d",node="n1"} > 0')
        assert client.stale_series(instant, 30.0, at=now - 15) == {}
        assert client.stale_series(instant, 5.0, at=now - 15) == {}
