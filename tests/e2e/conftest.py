"""The real loop for end-to-end tests: simulated fleet → real Prometheus → engine → fleet.

Each test gets its own fleet (with the initial jobs it asks for), Prometheus (free loopback
port, temporary data dir, 1 s scrapes) and engine running the demo-scale policies of
``rules/demo``. Waiting is always for a condition, with a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuops.model.decisions import Decision, Outcome
from gpuops.runtime import Engine
from gpuops.settings import PrometheusSettings
from gpuops.sim.demo import DEMO_RULES, PROMETHEUS_CONFIG
from gpuops.sim.fleet import FleetConfig, FleetSim, JobSpec
from gpuops.sources.promproc import PrometheusServer
from tests.builders import build_engine
from tests.waiting import wait_for


@dataclass
class Loop:
    fleet: FleetSim
    prometheus: PrometheusServer
    engine: Engine
    spool: Path
    decisions: list[tuple[Decision, Outcome | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, decision: Decision, outcome: Outcome | None) -> None:
        with self.lock:
            self.decisions.append((decision, outcome))

    def state(self) -> dict[str, Any]:
        resp = requests.get(f"{self.fleet.control_url}/api/v1/state", timeout=5)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = requests.post(self.fleet.control_url + path, json=body or {}, timeout=5)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def fired(self, policy: str) -> list[tuple[Decision, Outcome | None]]:
        with self.lock:
            return [
                (d, o)
                for d, o in self.decisions
                if d.policy == policy and d.transition.value == "fire"
            ]

    def executed(self, policy: str, transition: str = "fire") -> list[Outcome]:
        with self.lock:
            return [
                o
                for d, o in self.decisions
                if d.policy == policy and d.transition.value == transition and o is not None
            ]

    def evaluations(self, policy: str) -> float:
        group = self.engine.rules.policy(policy)
        assert group is not None
        value = self.engine.metrics.registry.get_sample_value(
            "gpuops_engine_evaluations_total", {"group": group.group, "policy": policy}
        )
        return value or 0.0

    def query_failures(self, policy: str) -> float:
        value = self.engine.metrics.registry.get_sample_value(
            "gpuops_engine_query_failures_total", {"policy": policy}
        )
        return value or 0.0

    def wait_scraped(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            r = requests.get(
                f"{self.prometheus.url}/api/v1/query",
                params={
                    "query": "count(nvml_gpu_utilization_ratio) and count(gpuops_gpu_allocated)"
                },
                timeout=5,
            ).json()
            return bool(r["data"]["result"])

        wait_for(ready, timeout, "Prometheus to scrape the fleet")


StartLoop = Callable[..., Loop]


@pytest.fixture
def start_loop(tmp_path: Path) -> Iterator[StartLoop]:
    started: list[tuple[FleetSim, PrometheusServer, Engine]] = []

    def start(jobs: tuple[JobSpec, ...], nodes: int = 3, gpus_per_node: int = 2) -> Loop:
        fleet = FleetSim(
            FleetConfig.single_pool(
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                initial_jobs=jobs,
                arrival_rate_per_min=0.0,
                sd_file=str(tmp_path / "targets.json"),
            )
        ).start()
        prom = PrometheusServer(
            tmp_path / "prometheus",
            PROMETHEUS_CONFIG.format(interval="1s") + fleet.scrape_config("1s"),
        )
        try:
            prom.start()
        except BaseException:
            fleet.stop()
            raise
        loop = Loop(fleet, prom, None, tmp_path / "audit")  # type: ignore[arg-type]
        engine = build_engine(
            tmp_path,
            [DEMO_RULES],
            prometheus=PrometheusSettings(url=prom.url, timeout=2.0),
            executor_settings={"fleet": {"url": fleet.control_url}},
            listener=loop.record,
            reload=False,  # Engine.start loads them
        )
        loop.engine = engine
        started.append((fleet, prom, engine))
        loop.wait_scraped()
        engine.start()
        return loop

    yield start
    for fleet, prom, engine in reversed(started):
        engine.stop()
        prom.stop()
        fleet.stop()
