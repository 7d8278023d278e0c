"""From a GPU fault to its node's quarantine issued: the push path, and Prometheus alone.

Push: the NVML exporter over a fake NVML of 8 H100s, scraped every 100 ms (a loaded node),
its queue on disk (``--memory-queue``: in memory), pushes to a running engine API (real SQLite
state, fsync'd audit spool, the alert inbox, the gate, a no-op executor); each run injects
XID 79 on one GPU of another node and times NVML's event to the quarantine's executed outcome.
Prometheus alone: the same exporter scraped by a
real Prometheus every ``--scrape`` seconds, the shipped ``quarantine-on-hardware-xid`` policy
evaluated every ``--group`` seconds (no ``for``); each run injects XID 79 and times it to the
executed outcome, whose bound is scrape interval + group interval (+ ``for``, 0 here).

Prints each path's median, p95 and maximum; never fails on noise.

Run: ``python -m tests.benchmarks.bench_health_push [--runs 20] [--prom-runs 5]
[--memory-queue]``.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import requests

from gpuops.api.app import create_app
from gpuops.api.server import ApiServer
from gpuops.exporters.nvml.push import HealthPusher
from gpuops.exporters.nvml.scenarios import healthy_h100
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.model.decisions import Decision, Outcome
from gpuops.settings import ApiSettings, PrometheusSettings
from gpuops.sources.promproc import PrometheusServer
from tests.builders import build_engine, write_tokens
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PUSH_RULES = """
groups:
  - name: health
    interval: 1h
    rules:
      - policy: quarantine-faulty-gpu-node
        trigger: {alertmanager: {alertname: GpuFault}}
        action: {type: migrate, executor: log}
        cooldown: 1h
        mode: enforce
"""


class Quarantines:
    """When each node's quarantine was executed (the engine's decision listener)."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, decision: Decision, outcome: Outcome | None) -> None:
        if decision.policy == self.policy and outcome is not None and outcome.ok:
            with self.lock:
                self.at.setdefault(decision.target.labels.get("node", ""), time.monotonic())

    def of(self, node: str) -> float | None:
        with self.lock:
            return self.at.get(node)


@contextmanager
def loaded_exporter(push: HealthPusher | None) -> Iterator[ExporterServer]:
    """An exporter of 8 fake H100s whose /metrics is read every 100 ms while it runs."""
    server = ExporterServer(healthy_h100(), host="127.0.0.1", port=0, xid_poll_ms=20, push=push)
    server.start()
    stop = threading.Event()

    def scrape() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                session.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
                stop.wait(0.1)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        wait_for(lambda: server.xids is not None and server.xids.watching == 8, 10, "XIDs")
        yield server
    finally:
        stop.set()
        scraper.join(5)
        server.close()


def push_path(runs: int, on_disk: bool = True) -> list[float]:
    latencies = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        token = secrets.token_urlsafe(24)
        write_tokens(workdir / "tokens.yaml", {"alertmanager": token}, ["alertmanager"])
        settings = ApiSettings(tokens_file=workdir / "tokens.yaml")
        seen = Quarantines("quarantine-faulty-gpu-node")
        engine = build_engine(workdir, {"health.yaml": PUSH_RULES}, listener=seen, api=settings)
        server = None
        try:
            engine.alerts.start()
            server = ApiServer(create_app(engine, settings, environ={}), "127.0.0.1:0", None, None)
            server.start()
            for run in range(runs):
                node = f"node-{run:03d}"
                queue = workdir / "agents" / node / "health-events" if on_disk else None
                pusher = HealthPusher(server.url, token, node, queue_dir=queue)
                with loaded_exporter(pusher) as exporter:
                    injected = time.monotonic()
                    exporter.session.backend.inject_xid(run % 8, 79)
                    acted = wait_for(lambda n=node: seen.of(n), 30, f"{node} quarantined")
                latencies.append(acted - injected)
        finally:
            if server is not None:
                server.stop()
            engine.stop()
    return latencies


def prometheus_path(runs: int, scrape: float, group: float) -> list[float]:
    """One exporter per run (node-0, node-1, ...), all scraped from the start; run i injects XID
    79 on node-i once the policies have evaluated the steady fleet."""
    rules = (ROOT / "rules" / "health" / "health.yaml").read_text()
    rules = rules.replace("interval: 15s", f"interval: {group:g}s")
    rules = rules.replace("executor: scheduler", "executor: log")
    rules = rules.replace("        limits:", "        mode: enforce\n        limits:")
    rules = rules.replace("max_fraction: 0.1", "max_fraction: 1")  # 3 nodes, one fault each
    latencies = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        seen = Quarantines("quarantine-on-hardware-xid")
        exporters = [stack.enter_context(loaded_exporter(None)) for _ in range(runs)]
        targets = "".join(
            f"      - targets: ['127.0.0.1:{e.port}']\n        labels: {{node: node-{i}}}\n"
            for i, e in enumerate(exporters)
        )
        prom = PrometheusServer(
            workdir / "prom",
            f"global:\n  scrape_interval: {scrape:g}s\n  evaluation_interval: {scrape:g}s\n"
            f"scrape_configs:\n  - job_name: gpu-nodes\n    static_configs:\n{targets}",
        )
        prom.start()
        stack.callback(prom.stop)
        engine = build_engine(
            workdir,
            {"health.yaml": rules},
            prometheus=PrometheusSettings(url=prom.url, timeout=2.0),
            listener=seen,
            reload=False,
        )
        engine.start()
        stack.callback(engine.stop)
        wait_for(lambda: _up(prom.url) == runs, 30, "the exporters scraped")
        time.sleep(2 * group)  # the policies evaluated the steady fleet (no condition to wait on)
        for run, exporter in enumerate(exporters):
            node = f"node-{run}"
            injected = time.monotonic()
            exporter.session.backend.inject_xid(0, 79)
            acted = wait_for(lambda n=node: seen.of(n), 60, f"{node} quarantined")
            latencies.append(acted - injected)
    return latencies


def _up(url: str) -> int:
    query = 'sum(up{job="gpu-nodes"})'
    r = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5)
    result = r.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def _summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"median {statistics.median(ordered):.3f} s, p95 {p95:.3f} s, max {ordered[-1]:.3f} s "
        f"({len(ordered)} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="push-path faults")
    parser.add_argument(
        "--memory-queue",
        action="store_true",
        help="the agent's queue in memory (as without a state directory), not on disk",
    )
    parser.add_argument("--prom-runs", type=int, default=3, help="Prometheus-path faults")
    parser.add_argument("--scrape", type=float, default=1.0, help="scrape interval, seconds")
    parser.add_argument("--group", type=float, default=5.0, help="group interval, seconds")
    args = parser.parse_args()
    pushed = push_path(args.runs, on_disk=not args.memory_queue)
    queue = "in memory" if args.memory_queue else "on disk"
    print(f"push path (queue {queue}), XID 79 -> quarantine executed: {_summary(pushed)}")
    if args.prom_runs:
        scraped = prometheus_path(args.prom_runs, args.scrape, args.group)
        bound = args.scrape + args.group
        print(
            f"Prometheus alone, XID 79 -> quarantine executed: {_summary(scraped)}; "
            f"bound scrape {args.scrape:g} s + group {args.group:g} s + for 0 s = {bound:g} s"
        )


if __name__ == "__main__":
    main()
