"""The real loop on Slurm: a local Slurm cluster (tests/slurm/cluster.py), a fake NVML exporter
per static node (its GPUs' minor numbers follow the node's gres.conf), the Slurm exporter, a real
Prometheus scraping them every second with the recording rule of deploy/prometheus/slurm, and
the engine with the test-scale policies of rules.yaml, `scheduler` mapped to `slurm`."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import requests

from engine.config import AuditConfig, EngineConfig, PrometheusSettings
from engine.decisions import Decision, Outcome
from engine.promproc import PrometheusServer
from engine.runtime import Engine
from exporters.nvml.fake import FakeNvml
from exporters.nvml.scenarios import h100
from exporters.nvml.server import ExporterServer
from exporters.slurm.client import SlurmClient
from exporters.slurm.gres import minor_numbers
from exporters.slurm.server import SlurmExporter
from tests.slurm.cluster import SlurmCluster
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
RULES = Path(__file__).with_name("rules.yaml")
RECORDING_RULES = ROOT / "deploy" / "prometheus" / "slurm" / "gpuops-slurm.rules.yml"


@dataclass
class SlurmLoop:
    slurm: SlurmCluster
    nvml: dict[str, FakeNvml]
    exporters: dict[str, ExporterServer]
    prometheus: PrometheusServer
    engine: Engine
    decisions: list[tuple[Decision, Outcome | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, decision: Decision, outcome: Outcome | None) -> None:
        with self.lock:
            self.decisions.append((decision, outcome))

    def executed(self, policy: str, transition: str = "fire") -> list[tuple[Decision, Outcome]]:
        with self.lock:
            return [
                (d, o)
                for d, o in self.decisions
                if d.policy == policy and d.transition.value == transition and o is not None
            ]

    def node(self, name: str) -> dict[str, Any]:
        nodes = json.loads(self.slurm.cmd("sinfo", "--json"))["nodes"]
        found: dict[str, Any] = next(n for n in nodes if n["name"] == name)
        return found

    def job(self, job_id: str) -> dict[str, Any]:
        jobs = json.loads(self.slurm.cmd("squeue", "--json"))["jobs"]
        found: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
        return found

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = requests.get(
            f"{self.prometheus.url}/api/v1/query", params={"query": expr}, timeout=5
        )
        result: list[dict[str, Any]] = resp.json()["data"]["result"]
        return result

    def stop_exporter(self, node: str) -> None:
        self.exporters[node].close()

    def start_exporter(self, node: str) -> None:
        port = self.exporters[node].port
        self.exporters[node] = ExporterServer(
            self.nvml[node], host="127.0.0.1", port=port, xid_events=False
        )
        self.exporters[node].start()


def _fake_nvml(node: str, gpus: int, first_minor: int) -> FakeNvml:
    return FakeNvml(
        [
            replace(h100(i), uuid=f"GPU-{node}-{i}", minor_number=first_minor + i, util_gpu=90)
            for i in range(gpus)
        ]
    )


def _prometheus_config(loop_nodes: dict[str, int], slurm_port: int) -> str:
    targets = "\n".join(
        f"      - targets: ['127.0.0.1:{port}']\n        labels: {{node: {node}, pool: gpu}}"
        for node, port in loop_nodes.items()
    )
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RECORDING_RULES}']\n"
        "scrape_configs:\n"
        "  - job_name: gpu-nodes\n"
        "    static_configs:\n"
        f"{targets}\n"
        "  - job_name: slurm\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{slurm_port}']}}]\n"
    )


@pytest.fixture
def slurm_loop(tmp_path: Path) -> Iterator[SlurmLoop]:
    root = Path(tempfile.mkdtemp(prefix="gpuops-e2e-slurm-", dir="/tmp"))
    slurm = SlurmCluster(root).start()
    stops: list[Any] = [lambda: shutil.rmtree(root, ignore_errors=True), slurm.stop]
    try:
        nvml: dict[str, FakeNvml] = {}
        servers: dict[str, ExporterServer] = {}
        for spec in slurm.nodes:
            if spec.cloud:  # scraped only while powered up in a real site: not here
                continue
            nvml[spec.name] = _fake_nvml(spec.name, spec.gpus, spec.first_minor)
            servers[spec.name] = ExporterServer(
                nvml[spec.name], host="127.0.0.1", port=0, xid_events=False
            )
            servers[spec.name].start()
        stops.append(lambda: [s.close() for s in servers.values()])
        client = SlurmClient(conf=str(slurm.conf), timeout_s=5)
        exporter = SlurmExporter(
            client, host="127.0.0.1", port=0, gres_minors=minor_numbers(slurm.gres_conf, client)
        ).start()
        stops.append(exporter.stop)
        prom = PrometheusServer(
            tmp_path / "prometheus",
            _prometheus_config({n: s.port for n, s in servers.items()}, exporter.port),
        )
        prom.start()
        stops.append(prom.stop)
        config = EngineConfig(
            prometheus=PrometheusSettings(url=prom.url, timeout=3.0),
            rules=[RULES],
            state_file=tmp_path / "state.sqlite",
            audit=AuditConfig(spool_dir=tmp_path / "audit"),
            executors={
                "scheduler": {"use": "slurm"},
                "slurm": {"slurm_conf": str(slurm.conf), "timeout_s": 5},
            },
            metrics_listen=None,
        )
        loop = SlurmLoop(slurm, nvml, servers, prom, None)  # type: ignore[arg-type]
        loop.engine = Engine(config, listener=loop.record)
        stops.append(loop.engine.stop)
        wait_for(
            lambda: loop.query("count(nvml_gpu_info) > 0 and on() gpuops_slurm_up == 1"),
            30,
            "Prometheus to scrape the nodes and Slurm",
        )
        loop.engine.start()
        yield loop
    finally:
        for stop in reversed(stops):
            stop()
