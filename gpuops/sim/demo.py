"""`gpuops demo`: the whole loop on one machine — simulated fleet, a real Prometheus scraping it,
the engine with demo-scale policies (``rules/demo``) acting through the ``fleet`` executor.

Called by ``gpuops.cli.demo``. It injects the conditions over the run (an idle GPU and a lightly
used one from the start, a burst of jobs, a new policy added in dry-run, two nodes failing at
once — one is held back by the blast-radius limit —, load returning to the downclocked GPU),
prints each decision as it happens and a summary at the end (``gpuops.sim.demo_report``), and stops
every process it started, on Ctrl-C too. While it runs it serves the engine's API and web console
(``gpuops.sim.demo_console``) with an admin user of its own, so that the downclock, which waits
for an admin's approval, can be granted there or with ``gpuops approvals grant``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from gpuops.api import ApiServer
from gpuops.audit.spool import read_spool
from gpuops.model.decisions import Decision, Outcome
from gpuops.model.telling import doing, outcome_words, verdict_words
from gpuops.runtime import Engine
from gpuops.settings import ApiSettings, AuditConfig, EngineConfig, PrometheusSettings
from gpuops.sim.demo_console import ADMIN, ApprovalStory, admin_token, check_port, serve
from gpuops.sim.demo_report import DemoReport, fmt
from gpuops.sim.fleet import FleetConfig, FleetSim, JobSpec
from gpuops.sources.promproc import PrometheusServer

log = logging.getLogger(__name__)

DEMO_RULES = Path(__file__).resolve().parents[2] / "rules" / "demo"

PROMETHEUS_CONFIG = """\
global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
"""

NEW_POLICY = """\
# Added by `gpuops demo` while it runs, as you would try a change: scale out earlier, at more
# than 5 waiting jobs instead of 10. Without `mode`, a new policy runs in dry-run -- it decides
# and audits what it would do, it executes nothing -- until you set `mode: enforce`.
groups:
  - name: capacity-trial
    interval: 5s
    rules:
      - policy: scale-out-early
        description: Add a node when more than 5 jobs wait for nodes (trying a lower threshold).
        expr: |
          sum by (pool) (
            gpuops_queue_pending_jobs{reason=~"|None|Resources|Priority|ReqNodeNotAvail.*"}
          ) > 5
        for: 10s
        target: [pool]
        action: {type: scale_out, executor: fleet, params: {nodes: 1}}
"""
"""The policy the demo adds at its ``new_policy`` step (into its copy of the rules)."""


@dataclass(frozen=True)
class DemoSettings:
    duration_s: float = 180.0
    """Seconds to run: the story's last step comes at 135 s; 0 runs until Ctrl-C (the story
    plays once, then the loop goes on)."""
    workdir: Path | None = None
    """Where Prometheus data, engine state and the default audit spool go; None: a temp dir."""
    audit_dir: Path | None = None
    """The audit spool (ECS JSON lines); None: a new temporary directory, kept at exit."""
    rules: Path = DEMO_RULES
    nodes: int = 4
    gpus_per_node: int = 4
    seed: int = 42
    scrape_interval: str = "1s"
    api_listen: str | None = "127.0.0.1:9843"
    """host:port of the engine's API and web console while the demo runs (port 0: any free
    one); None: neither is served."""
    api_flag: str = "--api-port"
    """The option that sets the port, named when the port is taken."""
    timeline: tuple[tuple[float, str], ...] = (
        (35.0, "burst"),
        (50.0, "new_policy"),
        (70.0, "fail_nodes"),
        (100.0, "load_returns"),
        (135.0, "restore_node"),
    )
    """(seconds after start, step) of the injected conditions."""


class Demo:
    def __init__(self, settings: DemoSettings, out: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.out = out
        self.report = DemoReport()
        self._rules_dir = settings.rules
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self.approvals = ApprovalStory(self.say)
        self.url: str | None = None
        """The API's and console's base URL once they serve."""
        self.token: str | None = None
        """The token of the demo's admin user (``demo_console.ADMIN``) once made."""
        self.approvals_told: list[str] = []

    # --- printing ----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.out(f"[{time.monotonic() - self._t0:6.1f}s] {text}")

    def on_decision(self, decision: Decision, outcome: Outcome | None) -> None:
        with self._lock:
            self.report.add(decision, outcome)
        verb = decision.action.type if decision.action else None
        if outcome is not None:
            told = outcome_words(outcome, verb)
        else:
            told = verdict_words(decision.verdict, decision.reason or "")
        self.say(
            f"{decision.policy}: {doing(decision.transition, verb)} on {decision.target.key} "
            f"-> {told} [{decision.verdict}]"
        )
        self.approvals.on_decision(decision, outcome)

    def summary(self, elapsed_s: float) -> str:
        """The report's summary and what became of each approval asked for."""
        return "\n".join([self.report.summary(elapsed_s), *self.approvals_told])

    # --- the run -----------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> DemoReport:
        stop = stop or threading.Event()
        s = self.settings
        if s.api_listen is not None:
            check_port(s.api_listen, s.api_flag)
        with contextlib.ExitStack() as stack:
            workdir = s.workdir or Path(stack.enter_context(_tempdir()))
            # the audit trail outlives the demo (Prometheus data and engine state do not)
            audit_dir = s.audit_dir or Path(tempfile.mkdtemp(prefix="gpuops-demo-audit-"))
            self.report.audit_dir = audit_dir
            self.out(f"audit spool: {audit_dir} (ECS JSON lines, kept after the demo)")
            fleet = stack.enter_context(self._fleet(workdir))
            self._rules_dir = _copy_rules(s.rules, workdir / "rules")
            prom = self._prometheus(workdir, fleet)
            stack.callback(prom.stop)
            prom.start()
            self.say(f"Prometheus: {prom.url}")
            engine = Engine(
                self._engine_config(workdir, audit_dir, prom, fleet), listener=self.on_decision
            )
            engine.start()
            api: ApiServer | None = None
            try:
                policies = sum(1 for _ in engine.rules.policies())
                self.say(f"engine: {policies} policies from {s.rules}")
                if s.api_listen is not None:
                    api = serve(engine, s.api_flag)
                    self._tell_console(api.url)
                self._play(fleet, stop)
            finally:
                if api is not None:
                    api.stop()
                self.report.add_repeats(_held_repeats(engine))  # the store closes at stop
                self.approvals_told = self.approvals.summary(engine.store.approvals())
                engine.stop()
            self.report.end_utilization = _allocated_utilization(fleet.control_url)
            self.report.counters = dict(_state(fleet.control_url).get("counters", {}))
            documents = list(read_spool(audit_dir))
            self.report.audit_documents = len(documents)
            self.report.find_record(documents)
        return self.report

    def _tell_console(self, url: str) -> None:
        self.url = self.approvals.url = url
        self.say(f"console: {url}/ (sign in with the admin token); API: {url}/api/v1")
        self.say(f"admin token ({ADMIN}): {self.token}")
        self.say(f"in another terminal: export GPUOPS_URL={url} GPUOPS_TOKEN={self.token}")

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
        api = ApiSettings()
        if self.settings.api_listen is not None:
            tokens = workdir / "api-tokens.yaml"
            tokens.unlink(missing_ok=True)  # the demo's own, of an earlier run in this workdir
            self.token = admin_token(tokens)
            api = ApiSettings(listen=self.settings.api_listen, tokens_file=tokens)
        return EngineConfig(
            prometheus=PrometheusSettings(url=prom.url, timeout=5.0),
            rules=[self._rules_dir],
            state_file=workdir / "engine-state.sqlite",
            audit=AuditConfig(spool_dir=audit_dir),
            executors={"fleet": {"url": fleet.control_url}},
            metrics_listen=None,
            api=api,
        )

    def _play(self, fleet: FleetSim, stop: threading.Event) -> None:
        s = self.settings
        url = fleet.control_url
        stop.wait(3.0)
        self.report.start_utilization = _allocated_utilization(url)
        self.say(f"mean utilization of allocated GPUs: {fmt(self.report.start_utilization)}")
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
        elif step == "new_policy":
            path = self._rules_dir / "scale-out-early.yaml"
            path.write_text(NEW_POLICY)
            self.say(f"added: policy scale-out-early in {path} (no mode: it runs in dry-run)")
        elif step == "fail_nodes":
            nodes = self._busy_nodes(state)[:2]
            for node in nodes:
                _post(url, f"/api/v1/nodes/{node}/fail", {})
            if nodes:
                self.say(
                    f"injected: {' and '.join(nodes)} fail at once (their scrape targets go down;"
                    " max_fraction lets the engine evacuate only one)"
                )
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
    def _busy_nodes(state: dict[str, Any]) -> list[str]:
        """Up nodes running jobs, none of whose GPUs is downclocked (the clock story stays)."""
        return [
            str(node["name"])
            for node in state.get("nodes", [])
            if node.get("state") == "up"
            and any(g.get("job") for g in node.get("gpus", []))
            and not any(g.get("clock_locked_mhz") for g in node.get("gpus", []))
        ]


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


def _copy_rules(source: Path, into: Path) -> Path:
    """The demo's own copy of its rules (a file or the *.yaml of a folder): the policy it adds
    goes there, never into the repository."""
    into.mkdir(parents=True, exist_ok=True)
    for path in [source] if source.is_file() else sorted(source.glob("*.y*ml")):
        shutil.copy(path, into / path.name)
    return into


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


def _held_repeats(engine: Engine) -> int:
    """Re-decisions of the suppressions that still hold their targets (not recorded)."""
    return sum(
        t.held_repeats
        for policy in engine.rules.policies()
        for t in engine.store.policy_state(policy.name).targets.values()
    )
