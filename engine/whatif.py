"""`gpuops whatif`: one seeded workload twice — policies off, and policies on with the real
engine evaluating them at a virtual clock against a real Prometheus fed by remote write — and
what each achieved (docs/whatif.md).

Called by ``engine.cli.whatif`` and the benchmark; ``engine.whatif_report`` compares the two
runs (table, JSON), ``engine.whatif_plots`` draws them. The "on" run builds the real
``engine.runtime.Engine`` with a virtual clock (its wall and its monotonic clock) and drives it
without its scheduler: ``PolicyLoop.evaluate(t)`` runs ``Engine.evaluate_group`` for every
group whose interval divides ``t`` (and every cron ``schedule`` policy due at ``t``), then
waits until the gate has finished every action it started. The fleet
(``exporters.fleet.virtual``) does not move meanwhile, so an action decided at virtual ``t``
is in the cluster before it advances, and every sample up to ``t`` is in Prometheus before
the engine queries it (lockstep). Rules, PromQL, guardrails, state, audit and the ``fleet``
executor (over the fleet's control API on loopback) are the engine's own; nothing here
evaluates a policy.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import requests
from apscheduler.triggers.cron import CronTrigger

from engine.config import AuditConfig, EngineConfig, PrometheusSettings
from engine.decisions import Decision, Outcome, Sample
from engine.prometheus import PrometheusClient
from engine.promproc import PrometheusServer
from engine.rules.model import Group
from engine.runtime import Engine
from exporters.fleet.config import FleetConfig
from exporters.fleet.remotewrite import RemoteWriter
from exporters.fleet.report import Point, Recorder, RunReport
from exporters.fleet.virtual import Meter, VirtualFleet

log = logging.getLogger(__name__)

SCRAPE_INTERVAL_S = 30.0
"""Virtual seconds between two scrapes of the fleet (every series written at each)."""

CLUSTER_STEP_S = 15.0
"""Virtual seconds per cluster step in both runs (so that they step the cluster alike)."""

APPROVALS_EVERY_S = 30.0
"""How often (virtual seconds) pending approvals are checked for expiry, as the engine does."""

GROUP_WORKERS = 4
"""Groups evaluated at the same instant at once (their queries overlap in Prometheus)."""

ACTION_TIMEOUT_S = 60.0
"""Real seconds the loop waits for the actions of one evaluation instant to finish."""

PROMETHEUS_ARGS = ("--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=30d")
"""A Prometheus that takes samples by remote write and keeps the past the run writes."""

PROMETHEUS_ENV = {"GOGC": "400"}
"""The run's own Prometheus collects garbage when its heap has grown 4x, not 2x (Go's
default): a quarter less of its CPU in a 500-GPU run (measured: 4.5 s instead of 6.2 s for
30 busy virtual minutes of remote write), for a heap of some hundred MB more."""


class WhatifError(Exception):
    """The what-if cannot run (no Prometheus, rules that do not load, a stalled action)."""


class VirtualClock:
    """Seconds since the epoch at virtual second ``t`` of a run that starts at ``start_s``;
    the engine's wall and monotonic clock in the "on" run."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.t = 0.0

    def __call__(self) -> float:
        return self.start_s + self.t


@dataclass(frozen=True)
class RunResult:
    """One run: its figures, the fleet at every scrape, how long it took, what was decided."""

    report: RunReport
    points: tuple[Point, ...]
    wall_s: float
    decisions: dict[str, int]
    """``"policy verdict"`` -> decisions (the "on" run; empty for "off")."""
    outcomes: dict[str, int]
    """``"policy action status"`` -> executed actions' outcomes."""
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Where the run's time went: part -> (wall s, CPU s); NaN where not measured. See
    ``PARTS``."""


PARTS = (
    ("fleet step", "the cluster stepped (scheduler, workload, energy)"),
    ("record", "the figures observed at every scrape (exporters.fleet.report)"),
    ("collect", "every series' sample at every scrape"),
    ("encode", "protobuf and snappy"),
    ("Prometheus ingest", "remote-write requests until Prometheus answered (wall)"),
    ("engine evaluate", "the groups' cycles: queries, sample-age checks, state, audit intent"),
    ("gate", "waiting for the actions the gate started (executor calls over HTTP)"),
    ("Prometheus", "the Prometheus process: ingest and queries (CPU)"),
    ("all", "the whole run (CPU: this process)"),
)
"""The parts of ``RunResult.parts`` and what each holds."""


def start_time(hours: float, start_hour: float, now: float | None = None) -> float:
    """The epoch second the run starts at: whole seconds, late enough that the run ends about
    ten minutes before ``now`` (every sample in the past, none in the future), and at UTC hour
    ``start_hour`` so that cron ``schedule`` policies and the fleet's tariff hours agree."""
    latest = (time.time() if now is None else now) - hours * 3600.0 - 600.0
    day = math.floor((latest - start_hour * 3600.0) / 86400.0) * 86400.0
    return day + start_hour * 3600.0


def _hourly(hours: float) -> Iterator[float]:
    for hour in range(1, math.ceil(hours) + 1):
        yield min(float(hour), hours) * 3600.0


def run_off(
    config: FleetConfig, hours: float, scrape_interval_s: float = SCRAPE_INTERVAL_S
) -> RunResult:
    """The baseline: the cluster and its scheduler alone (nothing queries it, so nothing is
    written to Prometheus)."""
    recorder = Recorder()
    started = time.monotonic()
    fleet = VirtualFleet(
        config, 0, None, scrape_interval_s, step_s=CLUSTER_STEP_S, recorder=recorder
    )
    cpu = time.process_time()
    for t in _hourly(hours):
        fleet.run_until(t)
    wall = time.monotonic() - started
    parts = {
        "fleet step": fleet.step_time.pair(),
        "record": fleet.record_time.pair(),
        "all": (wall, time.process_time() - cpu),
    }
    return RunResult(recorder.report(fleet.cluster), tuple(recorder.points), wall, {}, {}, parts)


class PolicyLoop:
    """The engine without its scheduler: every group and cron policy evaluated at the virtual
    instants its schedule says, the actions finished before the loop returns."""

    def __init__(self, engine: Engine, clock: VirtualClock) -> None:
        self.engine = engine
        self.clock = clock
        self._crons: dict[str, tuple[Group, CronTrigger, float]] = {}
        self._approvals_at = 0.0
        self._pool = ThreadPoolExecutor(GROUP_WORKERS, thread_name_prefix="gpuops-whatif")
        self.evaluate_time = Meter()
        """The evaluation instants (wall) and the groups' cycles (CPU of their threads)."""
        self.gate_time = Meter()
        """Waiting for the gate's actions (wall)."""

    def open(self) -> None:
        """What ``Engine.start`` does before it schedules: check the stored guardrail state,
        load the rules (errors are fatal), start the audit, reconcile and resume."""
        e = self.engine
        e.store.guardrail_state()
        e.reload(strict=True)
        e.audit.start()
        e.gate.resume()
        for group in e.rules.groups:
            for policy in group.policies:
                if policy.schedule is None or policy.expr is None:
                    continue
                trigger = CronTrigger.from_crontab(policy.schedule, timezone=UTC)
                one = replace(group, policies=(policy,))
                self._crons[policy.name] = (one, trigger, self._next_cron(trigger, -1.0))

    def step_s(self) -> float:
        """The evaluation step: the greatest common divisor of the groups' intervals (whole
        seconds), at most a minute (cron times are whole minutes)."""
        step = 60
        for group in self.engine.rules.groups:
            step = math.gcd(step, max(1, round(group.interval_s)))
        return float(step)

    def _next_cron(self, trigger: CronTrigger, after_t: float) -> float:
        """The virtual second of ``trigger``'s first time after virtual second ``after_t``."""
        now = datetime.fromtimestamp(self.clock.start_s + after_t + 1e-3, UTC)
        fire = trigger.get_next_fire_time(None, now)
        return math.inf if fire is None else fire.timestamp() - self.clock.start_s

    def evaluate(self, t: float) -> None:
        """Evaluate, at virtual second ``t``, every group and cron policy due then; wait for
        the actions they started."""
        self.clock.t = t
        e = self.engine
        started = time.perf_counter()
        due: list[Future[float]] = []
        for group in e.rules.groups:
            if round(t) % max(1, round(group.interval_s)) == 0:
                due.append(self._pool.submit(self._timed, group, False))
        for name, (group, trigger, at) in list(self._crons.items()):
            if at <= t:
                due.append(self._pool.submit(self._timed, group, True))
                self._crons[name] = (group, trigger, self._next_cron(trigger, t))
        # groups run side by side, as the engine's scheduler runs them
        cpu = sum(future.result() for future in due)
        if t >= self._approvals_at:
            e.expire_approvals()
            self._approvals_at = t + APPROVALS_EVERY_S
        waiting = time.perf_counter()
        self.evaluate_time.add(waiting - started, cpu)
        idle = e.wait_idle(ACTION_TIMEOUT_S)
        self.gate_time.add(time.perf_counter() - waiting, math.nan)
        if not idle:
            raise WhatifError(
                f"actions decided at virtual second {t:.0f} did not finish within "
                f"{ACTION_TIMEOUT_S:.0f} s"
            )

    def _timed(self, group: Group, scheduled: bool) -> float:
        """Evaluate ``group``; returns the CPU seconds of this thread it took."""
        started = time.thread_time()
        self.engine.evaluate_group(group, scheduled)
        return time.thread_time() - started

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.engine.stop()


class LockstepPrometheus(PrometheusClient):
    """The engine's Prometheus client in the "on" run: an instant query asked again at the
    same evaluation time answers what it answered (the policies of one group, and the
    groups of one instant, share selectors and sample-age probes). That is exact here, not
    an approximation: in lockstep nothing is written while the engine evaluates instant
    ``t``, so a query at ``t`` cannot change its answer (a live engine may not do this:
    samples arrive meanwhile). Answers of earlier instants are forgotten; errors are not
    kept."""

    def __init__(self, url: str, session: requests.Session) -> None:
        super().__init__(url, session=session)
        self._at: float | None = None
        self._answers: dict[str, tuple[Sample, ...]] = {}
        self._lock = threading.Lock()
        self.asked = 0
        self.answered = 0
        """Queries asked, and those answered from an earlier answer at the same instant."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        if at is None:
            return super().query(expr)
        with self._lock:
            self.asked += 1
            if at != self._at:
                self._at = at
                self._answers = {}
            known = self._answers.get(expr)
            if known is not None:
                self.answered += 1
                return known
        found = super().query(expr, at=at)
        with self._lock:
            if at == self._at:
                self._answers[expr] = found
        return found


class _Tally:
    """The decisions and outcomes of the "on" run (the engine's ``DecisionListener``)."""

    def __init__(self) -> None:
        self.decisions: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()

    def __call__(self, decision: Decision, outcome: Outcome | None) -> None:
        if outcome is None:
            self.decisions[f"{decision.policy} {decision.verdict}"] += 1
        elif decision.action is not None:
            key = f"{decision.policy} {decision.action.type} {outcome.status.value}"
            self.outcomes[key] += 1


def run_on(
    config: FleetConfig,
    rules: list[Path],
    hours: float,
    prometheus_url: str,
    workdir: Path,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
    progress: Callable[[float], None] | None = None,
    prometheus_cpu: Callable[[], float] = lambda: math.nan,
) -> RunResult:
    """The same workload with the policies of ``rules`` evaluated by the engine at the
    virtual clock against ``prometheus_url`` (a fresh Prometheus with the remote-write
    receiver), acting on the cluster through the fleet's control API. ``workdir`` holds the
    engine's state file and audit spool (``workdir/audit``: every decision of the run).
    ``prometheus_cpu``: the CPU seconds Prometheus has used so far (for ``parts``)."""
    clock = VirtualClock(start_time(hours, config.start_hour))
    recorder = Recorder()
    writer = RemoteWriter(prometheus_url)
    fleet = VirtualFleet(
        config,
        int(clock.start_s * 1000),
        writer,
        scrape_interval_s,
        step_s=CLUSTER_STEP_S,
        recorder=recorder,
    )
    tally = _Tally()
    started = time.monotonic()
    cpu, prometheus_started = time.process_time(), prometheus_cpu()
    with fleet:
        control = fleet.serve_control()
        engine_config = EngineConfig(
            prometheus=PrometheusSettings(url=prometheus_url, scrape_interval=scrape_interval_s),
            rules=rules,
            state_file=workdir / "state.sqlite",
            audit=AuditConfig(spool_dir=workdir / "audit"),
            executors={"fleet": {"url": control}},
            metrics_listen=None,
        )
        # loopback only: no proxy lookup from the environment on each of ~10^4 queries
        session = requests.Session()
        session.trust_env = False
        client = LockstepPrometheus(prometheus_url, session)
        engine = Engine(
            engine_config,
            clock=clock,
            monotonic=clock,
            prometheus=client,
            listener=tally,
        )
        loop = PolicyLoop(engine, clock)
        try:
            loop.open()
            step = loop.step_s()
            end = hours * 3600.0
            for i in range(math.floor(end / step) + 1):
                t = i * step
                fleet.run_until(t)
                loop.evaluate(t)
                if progress is not None and t % 3600.0 == 0:
                    progress(t)
            fleet.run_until(end)
        finally:
            loop.close()
    wall = time.monotonic() - started
    log.info(
        "what-if queries: %d asked, %d answered again at the same instant",
        client.asked,
        client.answered,
    )
    parts = {
        "fleet step": fleet.step_time.pair(),
        "record": fleet.record_time.pair(),
        "collect": fleet.collect_time.pair(),
        "encode": (writer.encode_s, writer.encode_s),
        "Prometheus ingest": (writer.send_s, math.nan),
        "engine evaluate": loop.evaluate_time.pair(),
        "gate": loop.gate_time.pair(),
        "Prometheus": (math.nan, prometheus_cpu() - prometheus_started),
        "all": (wall, time.process_time() - cpu),
    }
    return RunResult(
        recorder.report(fleet.cluster),
        tuple(recorder.points),
        wall,
        dict(tally.decisions),
        dict(tally.outcomes),
        parts,
    )


@dataclass(frozen=True)
class Served:
    """The Prometheus of the "on" run: its URL and how to read its CPU seconds so far (NaN
    when it is not ours or its process cannot be read)."""

    url: str
    cpu_s: Callable[[], float]


def _process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def prometheus(workdir: Path, url: str | None = None) -> Iterator[Served]:
    """``url`` when given (it must take remote write and hold no samples of this run's
    series), else a fresh Prometheus of its own, on a free loopback port, stopped at the end."""
    if url is not None:
        yield Served(url, lambda: math.nan)
        return
    config = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
    server = PrometheusServer(workdir, config, extra_args=list(PROMETHEUS_ARGS))
    server.env.update(PROMETHEUS_ENV)
    try:
        with server:
            assert server.proc is not None
            pid = server.proc.pid
            yield Served(server.url, lambda: _process_cpu_s(pid))
    except FileNotFoundError as exc:
        raise WhatifError(f"a Prometheus is needed for the policies-on run: {exc}") from None


def _scratch() -> str | None:
    """Where a run without ``--workdir`` keeps the engine's throwaway state file and audit
    spool: memory (``/dev/shm``) when the machine has it — the engine fsyncs both at every
    evaluation, as it must live, which a what-if need not pay on a disk — else the system's
    temporary directory. (Prometheus' data stays on disk: it is large.)"""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@dataclass(frozen=True)
class Whatif:
    """Both runs of one seeded workload."""

    fleet: str
    hours: float
    seed: int
    rules: tuple[str, ...]
    off: RunResult
    on: RunResult


def whatif(
    config: FleetConfig,
    rules: list[Path],
    hours: float,
    prometheus_url: str | None = None,
    workdir: Path | None = None,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
    progress: Callable[[str, float], None] | None = None,
) -> Whatif:
    """Run ``config`` for ``hours`` without and with the policies of ``rules``."""
    with (
        tempfile.TemporaryDirectory(prefix="gpuops-whatif-", dir=_scratch()) as tmp,
        tempfile.TemporaryDirectory(prefix="gpuops-whatif-prometheus-") as tmp_prom,
    ):
        engine_dir = workdir / "engine" if workdir else Path(tmp)
        prom_dir = workdir / "prometheus" if workdir else Path(tmp_prom)
        prom_dir.mkdir(parents=True, exist_ok=True)
        off = run_off(config, hours, scrape_interval_s)
        if progress is not None:
            progress("off", hours * 3600.0)
        with prometheus(prom_dir, prometheus_url) as served:
            on = run_on(
                config,
                rules,
                hours,
                served.url,
                engine_dir,
                scrape_interval_s,
                None if progress is None else (lambda t: progress("on", t)),
                served.cpu_s,
            )
    return Whatif(config.name, hours, config.seed, tuple(map(str, rules)), off, on)
