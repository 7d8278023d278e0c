"""`gpuops demo --slurm`: the demo's story on a real local Slurm instead of the simulated fleet.

Called by ``gpuops.cli.demo``; ``start_stack`` is also what ``tests/e2e/slurm`` runs. It starts a
local Slurm cluster (``gpuops.sim.slurmcluster``: 2 GPU nodes + 1 CLOUD node), a fake NVML
exporter per node whose GPUs follow the node's gres.conf minor numbers, the Slurm exporter, a
real Prometheus with the recording rule of ``deploy/prometheus/slurm`` and the engine with the
demo-scale policies of ``rules/demo-slurm`` (``scheduler`` mapped to ``slurm``). The story: an
idle GPU job is warned then requeued, a burst of jobs powers up the CLOUD node (and it is
powered down once idle), a node dies (drained with gpuops' reason, its jobs requeued) and comes
back (resumed). Each decision is printed; everything started is stopped, on Ctrl-C too.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import requests

from gpuops.exporters.nvml.fake import FakeNvml
from gpuops.exporters.nvml.scenarios import h100
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.exporters.slurm.server import SlurmExporter
from gpuops.integrations.slurm.client import SlurmClient
from gpuops.integrations.slurm.gres import minor_numbers
from gpuops.model.decisions import Decision, Outcome
from gpuops.model.telling import doing, effect, outcome_words, verdict_words
from gpuops.runtime import Engine
from gpuops.settings import AuditConfig, EngineConfig, PrometheusSettings
from gpuops.sim.slurmcluster import SlurmCluster
from gpuops.sources.promproc import PrometheusServer

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
SLURM_DEMO_RULES = ROOT / "rules" / "demo-slurm"
RECORDING_RULES = ROOT / "deploy" / "prometheus" / "slurm" / "gpuops-slurm.rules.yml"

Listener = Callable[[Decision, Outcome | None], None]


@dataclass
class SlurmStack:
    """Everything the demo (or a test) started; ``stop`` stops it in reverse order."""

    root: Path
    slurm: SlurmCluster
    nvml: dict[str, FakeNvml]
    exporters: dict[str, ExporterServer]
    prometheus: PrometheusServer
    engine: Engine
    stops: list[Callable[[], object]] = field(default_factory=list)

    def stop(self) -> None:
        for stop in reversed(self.stops):
            try:
                stop()
            except Exception:  # stopping the rest matters more than one failed stop
                log.exception("while stopping the Slurm demo")
        self.stops.clear()

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = requests.get(
            f"{self.prometheus.url}/api/v1/query", params={"query": expr}, timeout=5
        )
        result: list[dict[str, Any]] = resp.json()["data"]["result"]
        return result

    def node(self, name: str) -> dict[str, Any]:
        nodes = json.loads(self.slurm.cmd("sinfo", "--json"))["nodes"]
        found: dict[str, Any] = next(n for n in nodes if n["name"] == name)
        return found

    def job(self, job_id: str) -> dict[str, Any]:
        jobs = json.loads(self.slurm.cmd("squeue", "--json"))["jobs"]
        found: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
        return found

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


def prometheus_config(nodes: dict[str, int], slurm_port: int) -> str:
    """1 s scrapes of each node's NVML exporter (``node`` = the Slurm node name) and of the
    Slurm exporter (``honor_labels``: ``job`` is the Slurm job id), with the recording rule."""
    targets = "\n".join(
        f"      - targets: ['127.0.0.1:{port}']\n        labels: {{node: {node}, pool: gpu}}"
        for node, port in nodes.items()
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


def start_stack(
    workdir: Path, audit_dir: Path, listener: Listener, rules: Path = SLURM_DEMO_RULES
) -> SlurmStack:
    """Start everything (Slurm in a short /tmp directory: its Unix sockets need short paths);
    the engine is created but not started."""
    root = Path(tempfile.mkdtemp(prefix="gpuops-slurm-", dir="/tmp"))
    stops: list[Callable[[], object]] = [lambda: shutil.rmtree(root, ignore_errors=True)]
    try:
        slurm = SlurmCluster(root).start()
        stops.append(slurm.stop)
        nvml: dict[str, FakeNvml] = {}
        servers: dict[str, ExporterServer] = {}
        for spec in slurm.nodes:
            if spec.cloud:  # a real site scrapes a CLOUD node only while it is powered up
                continue
            nvml[spec.name] = _fake_nvml(spec.name, spec.gpus, spec.first_minor)
            servers[spec.name] = ExporterServer(
                nvml[spec.name], host="127.0.0.1", port=0, xid_events=False
            )
            servers[spec.name].start()

        def close_exporters() -> None:  # the servers of now (a restarted one replaced its old)
            for server in servers.values():
                server.close()

        stops.append(close_exporters)
        client = SlurmClient(conf=str(slurm.conf), timeout_s=5)
        exporter = SlurmExporter(
            client, host="127.0.0.1", port=0, gres_minors=minor_numbers(slurm.gres_conf, client)
        ).start()
        stops.append(exporter.stop)
        prom = PrometheusServer(
            workdir / "prometheus",
            prometheus_config({n: s.port for n, s in servers.items()}, exporter.port),
        )
        prom.start()
        stops.append(prom.stop)
        config = EngineConfig(
            prometheus=PrometheusSettings(url=prom.url, timeout=3.0),
            rules=[rules],
            state_file=workdir / "engine-state.sqlite",
            audit=AuditConfig(spool_dir=audit_dir),
            executors={
                "scheduler": {"use": "slurm"},
                "slurm": {"slurm_conf": str(slurm.conf), "timeout_s": 5},
            },
            metrics_listen=None,
        )
        engine = Engine(config, listener=listener)
        stops.append(engine.stop)
    except BaseException:
        for stop in reversed(stops):
            stop()
        raise
    return SlurmStack(root, slurm, nvml, servers, prom, engine, stops)


def wait_until(condition: Callable[[], object], timeout: float, stop: threading.Event) -> bool:
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        if condition():
            return True
        stop.wait(0.2)
    return False


class SlurmDemo:
    """The story, printed as it happens through ``echo``."""

    def __init__(self, workdir: Path, audit_dir: Path, echo: Callable[[str], None]) -> None:
        self.workdir = workdir
        self.audit_dir = audit_dir
        self.echo = echo
        self.counts: Counter[tuple[str, str]] = Counter()
        self._started = time.monotonic()

    def _on_decision(self, decision: Decision, outcome: Outcome | None) -> None:
        verb = decision.action.type if decision.action is not None else None
        self.counts[(decision.policy, decision.verdict)] += 1  # once: its intent or its outcome
        if outcome is None:
            said = verdict_words(decision.verdict, decision.reason)
        else:
            said = outcome_words(outcome, verb)
            if outcome.ok and not effect(verb, outcome.changed).did:
                self.counts[(decision.policy, "no effect")] += 1
        self.echo(
            f"{time.monotonic() - self._started:6.1f}s  {decision.policy} on"
            f" {decision.target.key}: {doing(decision.transition, verb)} {said}"
        )

    def run(self, stop: threading.Event) -> Counter[tuple[str, str]]:
        self.echo(
            f"starting a local Slurm (2 GPU nodes + 1 CLOUD node), Prometheus, engine; "
            f"audit spool: {self.audit_dir}"
        )
        stack = start_stack(self.workdir, self.audit_dir, self._on_decision)
        try:
            self._story(stack, stop)
        finally:
            stack.stop()
        return self.counts

    def _story(self, s: SlurmStack, stop: threading.Event) -> None:
        wait_until(
            lambda: s.query("gpuops_slurm_up == 1 and on() count(nvml_gpu_info) > 0"), 30, stop
        )
        s.engine.start()
        idle = s.slurm.submit(
            "--gres=gpu:1", "-w", "gpu-b", "-o", "/dev/null", "--wrap", "sleep 600"
        )
        for gpu in s.nvml["gpu-b"].gpus:
            gpu.util_gpu = 0
        self.echo(f"job {idle} holds an idle GPU on gpu-b: it is warned, then requeued")
        wait_until(lambda: s.job(idle)["restart_cnt"] >= 1, 60, stop)
        s.slurm.cmd("scancel", idle)
        for gpu in s.nvml["gpu-b"].gpus:  # the next jobs use their GPUs
            gpu.util_gpu = 90
        burst = [
            s.slurm.submit("--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 6")
            for _ in range(20)
        ]
        self.echo(f"a burst of {len(burst)} jobs: the CLOUD node cloud-1 is powered up")
        wait_until(lambda: s.node("cloud-1")["state"] in ("allocated", "mixed"), 60, stop)
        s.slurm.cmd("scancel", "--state=PENDING", "-u", "root")
        self.echo("the queue is empty again: cloud-1 is powered down once idle")
        wait_until(lambda: "POWERED_DOWN" in s.node("cloud-1")["state_flags"], 90, stop)
        job = s.slurm.submit(
            "--gres=gpu:1", "-w", "gpu-a", "-o", "/dev/null", "--wrap", "sleep 600"
        )
        wait_until(lambda: s.job(job)["job_state"] == "RUNNING", 30, stop)
        self.echo("gpu-a dies (slurmd killed, its exporter gone): drained, its job requeued")
        s.slurm.kill_slurmd("gpu-a")
        s.stop_exporter("gpu-a")
        wait_until(lambda: str(s.node("gpu-a")["reason"]).startswith("gpuops:"), 60, stop)
        s.slurm.start_slurmd("gpu-a")
        s.start_exporter("gpu-a")
        self.echo("gpu-a is back: resumed, because the drain reason is still gpuops'")
        wait_until(lambda: "DRAIN" not in s.node("gpu-a")["state_flags"], 60, stop)
        stop.wait(2)
