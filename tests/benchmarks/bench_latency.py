"""Decision latency from fault to action: a node of the simulated fleet
fails and the engine (demo-scale policies: 1 s scrapes, 5 s group interval, ``for: 5s``)
migrates its jobs through a real Prometheus. Prints, per run, the seconds from the failure to
the executed action and to the fleet showing the jobs moved; never fails on noise.

Run: ``python -m tests.benchmarks.bench_latency [--runs 3]``. The floor is ``for`` (5 s); the
rest is scrape interval, group interval (up to 5 s) and the action itself.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from gpuops.model.decisions import Decision, Outcome
from gpuops.settings import PrometheusSettings
from gpuops.sim.demo import DEMO_RULES, PROMETHEUS_CONFIG, demo_workload
from gpuops.sim.fleet import FleetConfig, FleetSim
from gpuops.sources.promproc import PrometheusServer
from tests.builders import build_engine
from tests.waiting import wait_for


def one_run(workdir: Path) -> tuple[float, float]:
    fleet = FleetSim(
        FleetConfig.single_pool(
            nodes=4,
            gpus_per_node=4,
            arrival_rate_per_min=0.0,
            initial_jobs=demo_workload(4, 4),
            sd_file=str(workdir / "targets.json"),
        )
    ).start()
    prom = PrometheusServer(
        workdir / "prom", PROMETHEUS_CONFIG.format(interval="1s") + fleet.scrape_config("1s")
    )
    executed = threading.Event()
    acted_at: list[float] = []

    def listener(decision: Decision, outcome: Outcome | None) -> None:
        if decision.policy == "migrate-off-down-nodes" and outcome is not None and outcome.ok:
            acted_at.append(time.monotonic())
            executed.set()

    try:
        prom.start()
        engine = build_engine(
            workdir,
            [DEMO_RULES],
            prometheus=PrometheusSettings(url=prom.url, timeout=2.0),
            executor_settings={"fleet": {"url": fleet.control_url}},
            listener=listener,
            reload=False,  # Engine.start loads them
        )
        engine.start()
        try:
            wait_for(lambda: _up(prom.url) == 4, 30, "4 node targets up")
            failed = time.monotonic()
            requests.post(f"{fleet.control_url}/api/v1/nodes/node-0/fail", json={}, timeout=5)
            executed.wait(60)
            moved = wait_for(lambda: _migrated(fleet.control_url), 60, "jobs moved")
            return acted_at[0] - failed, moved - failed
        finally:
            engine.stop()
    finally:
        prom.stop()
        fleet.stop()


def _up(url: str) -> int:
    r = requests.get(f"{url}/api/v1/query", params={"query": 'sum(up{job="gpu-nodes"})'}, timeout=5)
    result = r.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def _migrated(url: str) -> float | None:
    state = requests.get(f"{url}/api/v1/state", timeout=5).json()
    return time.monotonic() if state["counters"]["migrated"] >= 1 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    actions, moves = [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            action, moved = one_run(Path(tmp))
        actions.append(action)
        moves.append(moved)
        print(
            f"run {i + 1}: failure -> migrate executed {action:5.1f} s, jobs moved {moved:5.1f} s"
        )
    print(
        f"median: action {statistics.median(actions):.1f} s, moved {statistics.median(moves):.1f} s"
        " (policy for: 5 s, group interval 5 s, scrape 1 s)"
    )


if __name__ == "__main__":
    main()
