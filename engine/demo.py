"""`gpuops demo`: the whole loop on one machine — simulated fleet, a real Prometheus scraping it,
the engine with demo-scale policies (``rules/demo``) acting through the ``fleet`` executor.

Called by ``engine.cli.demo``. It injects the four conditions over the run (an idle GPU and a
lightly used one from the start, a burst of jobs, a node failure, load returning to the
downclocked GPU), prints each decision as it happens and a summary at the end, and stops every
process it started, on Ctrl-C too.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from engine.config import AuditConfig, EngineConfig, PrometheusSettings
from engine.decisions import Decision, Outcome
from engine.promproc import PrometheusServer
from engine.runtime import Engine
from exporters.fleet import FleetConfig, FleetSim, JobSpec

log = logging.getLogger(__name__)

DEMO_RULES = Path(__file__).resolve().parents[1] / "rules" / "demo"

PROMETHEUS_CONFIG = """\
global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
"""


@dataclass(frozen=True)
class DemoSettings:
    duration_s: float = 0.0
    """Seconds to run; 0 runs until Ctrl-C (the scenario plays once, then the loop goes on)."""
    workdir: Path | None = None
    """Where Prometheus data, engine state and the default audit spool go; None: a temp dir."""
    audit_dir: Path | None = None
    """The audit spool (ECS JSON lines); None: a new temporary directory, kept at exit."""
    rules: Path = DEMO_RULES
    nodes: int = 4
    gpus_per_node: int = 4
    seed: int = 42
    scrape_interval: str = "1s"
    timeline: tuple[tuple[float, str], ...] = (
        (35.0, "burst"),
        (70.0, "fail_node"),
        (100.0, "load_returns"),
        (135.0, "restore_node"),
    )
    """(seconds after start, step) of the injected conditions."""


@dataclass
class DemoReport:
    decisions: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    start_utilization: float | None = None
    end_utilization: float | None = None
    counters: dict[str, int] = field(default_factory=dict)
    audit_dir: Path | None = None
    audit_documents: int = 0

    def summary(self, elapsed: float) -> str:
        lines = [f"== gpuops demo summary ({elapsed:.0f} s) =="]
        lines.append("decisions by policy, transition and verdict:")
        for (policy, transition, verdict), n in sorted(self.decisions.items()):
            lines.append(f"  {policy:<28} {transition:<6} {verdict:<28} {n}")
        if not self.decisions:
            lines.append("  (none)")
        c = self.counters
        lines.append(
            f"GPUs reclaimed: {c.get('reclaimed', 0)}   nodes added: {c.get('nodes_added', 0)}   "
            f"jobs migrated: {c.get('migrated', 0)}   "
            f"GPUs downclocked: {c.get('downclocked', 0)}   "
            f"clocks restored: {c.get('restored', 0)}"
        )
        lines.append(
            "mean utilization of allocated GPUs: "
            f"start {_fmt(self.start_utilization)} -> end {_fmt(self.end_utilization)}"
        )
        lines.append(f"audit spool: {self.audit_dir} ({self.audit_documents} ECS documents)")
        lines.append(f"  search it: gpuops audit search --spool-dir {self.audit_dir}")
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


class Demo:
    def __init__(self, settings: DemoSettings, out: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.out = out
        self.report = DemoReport()
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    # --- printing ----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.out(f"[{time.monotonic() - self._t0:6.1f}s] {text}")

    def on_decision(self, decision: Decision, outcome: Outcome | None) -> None:
        with self._lock:
            key = (decision.policy, decision.transition.value, decision.verdict)
            self.report.decisions[key] += 1
            if outcome is not None:
                self.report.outcomes[outcome.status.value] += 1
        action = decision.action.type if decision.action else "(no on_clear action)"
        result = "not executed" if outcome is None else outcome.status.value
        if outcome is None and decision.action is None:
            result = "nothing to do"
        if outcome is not None and outcome.error:
            result += f" ({outcome.error})"
        self.say(
            f"{decision.policy}: {decision.transition.value} {action} on {decision.target.key} "
            f"-> {decision.verdict}, {result}"
        )

    # --- the run -----------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> DemoReport:
        stop = stop or threading.Event()
        s = self.settings
        with contextlib.ExitStack() as stack:
            workdir = s.workdir or Path(stack.enter_context(_tempdir()))
            # the audit trail outlives the demo (Prometheus data and engine state do not)
            audit_dir = s.audit_dir or Path(tempfile.mkdtemp(prefix="gpuops-demo-audit-"))
            self.report.audit_dir = audit_dir
            self.out(f"audit spool: {audit_dir} (ECS JSON lines, kept after the demo)")
            fleet = stack.enter_context(self._fleet(workdir))
            prom = self._prometheus(workdir, fleet)
            stack.callback(prom.stop)
            prom.start()
            self.say(f"Prometheus: {prom.url}")
            engine = Engine(
                self._engine_config(workdir, audit_dir, prom, fleet), listener=self.on_decision
            )
            engine.start()
            try:
                policies = sum(1 for _ in engine.rules.policies())
                self.say(f"engine: {policies} policies from {s.rules}")
                self._play(fleet, stop)
            finally:
                engine.stop()
            self.report.end_utilization = _allocated_utilization(fleet.control_url)
            self.report.counters = dict(_state(fleet.control_url).get("counters", {}))
            self.report.audit_documents = sum(
                len(p.read_text().splitlines()) for p in audit_dir.glob("*.jsonl")
            )
        return self.report

    def _fleet(self, workdir: Path) -> FleetSim:
        s = self.settings
        fleet = FleetSim(
            FleetConfig.single_pool(
                nodes=s.nodes,
                gpus_per_node=s.gpus_per_node,
                seed=s.seed,
                sd_file=str(workdir / "fleet-targets.json"),
                arrival_rate_per_min=0.0,
                initial_jobs=demo_workload(s.nodes, s.gpus_per_node),
            )
        )
        fleet.start()
        self.say(
            f"simulated fleet: {s.nodes} nodes x {s.gpus_per_node} GPUs at {fleet.control_url}"
        )
        return fleet

    def _prometheus(self, workdir: Path, fleet: FleetSim) -> PrometheusServer:
        interval = self.settings.scrape_interval
        config = PROMETHEUS_CONFIG.format(interval=interval) + fleet.scrape_config(interval)
        return PrometheusServer(
            workdir / "prometheus", config, extra_args=["--storage.tsdb.retention.time=1d"]
        )

    def _engine_config(
        self, workdir: Path, audit_dir: Path, prom: PrometheusServer, fleet: FleetSim
    ) -> EngineConfig:
        return EngineConfig(
            prometheus=PrometheusSettings(url=prom.url, timeout=5.0),
            rules=[self.settings.rules],
            state_file=workdir / "engine-state.sqlite",
            audit=AuditConfig(spool_dir=audit_dir),
            executors={"fleet": {"url": fleet.control_url}},
            metrics_listen=None,
        )

    def _play(self, fleet: FleetSim, stop: threading.Event) -> None:
        s = self.settings
        url = fleet.control_url
        stop.wait(3.0)
        self.report.start_utilization = _allocated_utilization(url)
        self.say(f"mean utilization of allocated GPUs: {_fmt(self.report.start_utilization)}")
        steps = list(s.timeline)
        while not stop.is_set():
            elapsed = time.monotonic() - self._t0
            if s.duration_s and elapsed >= s.duration_s:
                break
            while steps and elapsed >= steps[0][0]:
                _, step = steps.pop(0)
                self._inject(url, step)
            stop.wait(0.5)

    def _inject(self, url: str, step: str) -> None:
        state = _state(url)
        if step == "burst":
            _post(url, "/api/v1/pools/default/burst", {"count": 16, "gpus": 1, "duration_s": 600})
            self.say("injected: a burst of 16 one-GPU jobs (the queue grows past 10)")
        elif step == "fail_node":
            node = self._busy_node(state)
            if node:
                _post(url, f"/api/v1/nodes/{node}/fail", {})
                self.say(f"injected: {node} fails (its scrape target goes down)")
        elif step == "load_returns":
            for job in state.get("jobs", []):
                if job.get("profile") == "light" and job.get("state") == "running":
                    _post(url, f"/api/v1/jobs/{job['id']}/profile", {"profile": "training"})
                    self.say(f"injected: load returns on job {job['id']} (was lightly used)")
        elif step == "restore_node":
            for node in state.get("nodes", []):
                if node.get("state") in ("failed", "drained"):
                    _post(url, f"/api/v1/nodes/{node['name']}/restore", {})
                    self.say(f"injected: {node['name']} restored")

    @staticmethod
    def _busy_node(state: dict[str, Any]) -> str | None:
        for node in state.get("nodes", []):
            if node.get("state") == "up" and any(g.get("job") for g in node.get("gpus", [])):
                if not any(g.get("clock_locked_mhz") for g in node.get("gpus", [])):
                    return str(node["name"])
        return None


def demo_workload(nodes: int, gpus: int) -> tuple[JobSpec, ...]:
    """Every node but the last trains on all its GPUs; the last one holds an idle notebook
    (reclaim), a lightly used job (downclock), training on the rest, and one free GPU."""
    jobs = [JobSpec("training", gpus, "vision", node=f"node-{i}") for i in range(nodes - 1)]
    last = f"node-{nodes - 1}"
    jobs.append(JobSpec("notebook", 1, "research", node=last))
    if gpus >= 3:
        jobs.append(JobSpec("light", 1, "recsys", node=last))
    if gpus >= 4:
        jobs.append(JobSpec("training", gpus - 3, "nlp", node=last))
    return tuple(jobs)


def _tempdir() -> contextlib.AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix="gpuops-demo-")


def _state(url: str) -> dict[str, Any]:
    resp = requests.get(f"{url}/api/v1/state", timeout=5)
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


def _post(url: str, path: str, body: dict[str, Any]) -> None:
    resp = requests.post(url + path, json=body, timeout=5)
    if resp.status_code >= 400:
        log.warning("fleet refused %s: %s", path, resp.text[:200])


def _allocated_utilization(url: str) -> float | None:
    values = [
        float(g["utilization"])
        for node in _state(url).get("nodes", [])
        if node.get("state") == "up"
        for g in node.get("gpus", [])
        if g.get("job")
    ]
    return sum(values) / len(values) if values else None
