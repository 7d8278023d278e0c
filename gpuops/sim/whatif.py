"""`gpuops whatif`: one seeded workload twice — policies off, and policies on with the real
engine evaluating them at a virtual clock against a real Prometheus fed by remote write — and
what each achieved (docs/whatif.md).

Called by ``gpuops.cli.whatif`` and the benchmark; ``gpuops.sim.whatif_report`` compares the two
runs (table, JSON), ``gpuops.sim.whatif_plots`` draws them. The "on" run builds the real
``gpuops.runtime.Engine`` with a virtual clock (its wall and its monotonic clock) and drives it
without its scheduler: ``PolicyLoop.evaluate(t)`` runs ``Engine.evaluate_group`` for every
group whose interval divides ``t`` (and every cron ``schedule`` policy due at ``t``), then
waits until the gate has finished every action it started. The fleet
(``gpuops.sim.fleet.virtual``) does not move meanwhile, so an action decided at virtual ``t``
is in the cluster before it advances, and every sample up to ``t`` is in Prometheus before
the engine queries it (lockstep). Rules, PromQL, guardrails, state, audit and the ``fleet``
executor (over the fleet's control API on loopback) are the engine's own; nothing here
evaluates a policy.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import promql_parser
import requests
from apscheduler.triggers.cron import CronTrigger

from gpuops.model.decisions import Decision, Outcome, Sample, freeze
from gpuops.model.guardrails import population_expr
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import Group, Policy, RuleSet, cron_time
from gpuops.runtime import Engine
from gpuops.runtime.cycle import age_selectors
from gpuops.settings import AuditConfig, EngineConfig, PrometheusSettings
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.remotewrite import RemoteWriter
from gpuops.sim.fleet.report import Point, Recorder, RunReport
from gpuops.sim.fleet.virtual import Meter, VirtualFleet
from gpuops.sources.prometheus import AGE_LABEL, PrometheusClient, stale_expr
from gpuops.sources.promproc import PrometheusServer

log = logging.getLogger(__name__)

SCRAPE_INTERVAL_S = 30.0
"""Virtual seconds between two scrapes of the fleet (every series written at each)."""

RECORD_INTERVAL_S = 30.0
"""Virtual seconds between two observations of the figures, at most (a shorter scrape
interval observes at every scrape): what is measured does not get coarser with a longer
scrape interval."""


def record_interval(scrape_interval_s: float) -> float:
    return min(scrape_interval_s, RECORD_INTERVAL_S)


CLUSTER_STEP_S = 15.0
"""Virtual seconds per cluster step in both runs (so that they step the cluster alike)."""

APPROVALS_EVERY_S = 30.0
"""How often (virtual seconds) pending approvals are checked for expiry, as the engine does."""

ACTION_WORKERS = 1
"""Actions the gate runs at once per executor in the "on" run: one, so that an instant's
actions reach the fleet in the order they were decided (a seed gives the same run)."""

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
    queries: tuple[int, int] = (0, 0)
    """Instant queries the engine asked, and how many of them were answered from an answer
    (or a prefetch) at the same instant (``LockstepPrometheus``)."""
    series: tuple[int, int] = (0, 0)
    """Series written to Prometheus over the run, and samples written ("on" run)."""


PARTS = (
    ("fleet step", "the cluster stepped (scheduler, workload, energy)"),
    ("record", "the figures observed at every scrape (gpuops.sim.fleet.report)"),
    ("collect", "every series' sample at every scrape"),
    ("encode", "protobuf and snappy"),
    ("Prometheus ingest", "remote-write requests until Prometheus answered (wall)"),
    ("engine evaluate", "the groups' cycles: queries, stale-series checks, state, audit intent"),
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
        config,
        0,
        None,
        scrape_interval_s,
        step_s=CLUSTER_STEP_S,
        recorder=recorder,
        record_interval_s=record_interval(scrape_interval_s),
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

    def __init__(
        self, engine: Engine, clock: VirtualClock, prometheus: LockstepPrometheus | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.prometheus = prometheus
        """Prefetches each due group's queries (None: the cycle asks them one by one)."""
        self._crons: dict[str, tuple[Group, CronTrigger, float]] = {}
        self._approvals_at = 0.0
        self.evaluate_time = Meter()
        """The evaluation instants (wall) and the groups' cycles (CPU of their threads)."""
        self.gate_time = Meter()
        """Waiting for the gate's actions (wall)."""

    def bound(self, group: Group) -> float:
        """The freshness bound of ``group`` (seconds), as the engine's cycle reads it."""
        settings = self.engine.config.prometheus
        return settings.freshness(group.interval_s, group.max_sample_age_s).max_sample_age_s

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
        runs: list[tuple[Group, bool]] = []
        for group in e.rules.groups:
            if round(t) % max(1, round(group.interval_s)) == 0:
                runs.append((group, False))
        for name, (group, trigger, at) in list(self._crons.items()):
            if at <= t:
                runs.append((group, True))
                self._crons[name] = (group, trigger, self._next_cron(trigger, t))
        if self.prometheus is not None:
            self.prometheus.forget()
            now = self.clock()
            probes: dict[float, list[tuple[tuple[str, ...], float]]] = {}
            for group, scheduled in runs:
                at = cron_time(now) if scheduled else now
                probe = (age_selectors(_due(group, scheduled)), self.bound(group))
                probes.setdefault(at, []).append(probe)
            for at, selectors in probes.items():
                self.prometheus.prefetch_ages(selectors, at)
            for group, scheduled in runs:
                at = cron_time(now) if scheduled else now
                exprs = [p.expr for p in _due(group, scheduled) if p.expr is not None]
                self.prometheus.prefetch(exprs, at)
        # One group at a time, in name order, each group's actions finished before the next
        # group runs (the engine's gate runs one action at a time per executor here:
        # ``ACTION_WORKERS``): the actions of one instant reach the fleet in the same order
        # on every run, so a seed gives the same "on" run. A live engine runs groups side by
        # side; their queries were asked together above, and every group still decides on
        # the samples up to ``t`` (nothing is written to Prometheus until the next step).
        runs.sort(key=lambda run: (run[1], run[0].name))
        cpu = 0.0
        gate_s = 0.0
        for group, scheduled in runs:
            cpu += self._timed(group, scheduled)
            waiting = time.perf_counter()
            idle = e.wait_idle(ACTION_TIMEOUT_S)
            gate_s += time.perf_counter() - waiting
            if not idle:
                raise WhatifError(
                    f"actions decided at virtual second {t:.0f} did not finish within "
                    f"{ACTION_TIMEOUT_S:.0f} s"
                )
        if t >= self._approvals_at:
            e.expire_approvals()
            self._approvals_at = t + APPROVALS_EVERY_S
        waiting = time.perf_counter()
        self.evaluate_time.add(waiting - started - gate_s, cpu)
        idle = e.wait_idle(ACTION_TIMEOUT_S)
        self.gate_time.add(time.perf_counter() - waiting + gate_s, math.nan)
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
        self.engine.stop()


class LockstepPrometheus(PrometheusClient):
    """The engine's Prometheus client in the "on" run: an instant query asked again at the
    same evaluation time answers what it answered (the policies of one group, and the
    groups of one instant, share selectors and stale-series probes), and ``prefetch`` asks
    the queries a group's cycle will ask before it runs, side by side. That is exact here,
    not an approximation: in lockstep nothing is written while the engine evaluates instant
    ``t``, so a query at ``t`` cannot change its answer (a live engine may not do this:
    samples arrive meanwhile). Answers are kept by instant and query, so the interval groups
    (at ``now``) and the cron groups (at ``cron_time(now)``) of a step off the whole minute
    keep each other's, until ``forget`` at the start of the next step. A query in flight is
    waited for, not asked twice; errors are not kept (the next ask asks again)."""

    def __init__(self, url: str, session: requests.Session, workers: int = 4) -> None:
        super().__init__(url, session=session)
        self._answers: dict[tuple[float, str], Future[tuple[Sample, ...]]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpuops-whatif-prefetch")
        self.asked = 0
        self.answered = 0
        """Queries asked, and those answered from an earlier (or prefetched) answer."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        if at is None:
            return super().query(expr)
        answer, mine = self._claim(expr, at, asked=True)
        if mine:
            self._fetch(expr, at, answer)
        return answer.result()

    def prefetch(self, exprs: Iterable[str], at: float) -> None:
        """Start asking ``exprs`` at ``at`` in the background (each once)."""
        for expr in exprs:
            answer, mine = self._claim(expr, at, asked=False)
            if mine:
                self._pool.submit(self._fetch, expr, at, answer)

    def prefetch_ages(self, probes: Iterable[tuple[tuple[str, ...], float]], at: float) -> None:
        """Start asking the stale-series probes of ``probes`` (each the inputs of one group's
        ``gpuops.sources.prometheus.stale_expr`` and its freshness bound) at ``at``, as one probe of
        all their inputs per bound: each group's probe is then answered from it (the same
        series, numbered as that probe numbers its inputs), not asked. Exact: each input's
        part of a probe does not depend on the other parts. The groups of a step share
        inputs (the GPUs' utilization and allocation): each was read once per group before."""
        by_bound: dict[float, list[tuple[str, ...]]] = {}
        for selectors, bound_s in dict.fromkeys(probes):
            if selectors:
                by_bound.setdefault(bound_s, []).append(selectors)
        for bound_s, wanted in by_bound.items():
            self._prefetch_stale(wanted, bound_s, at)

    def _prefetch_stale(self, wanted: list[tuple[str, ...]], bound_s: float, at: float) -> None:
        union = tuple(dict.fromkeys(s for p in wanted for s in p))
        whole = stale_expr(union, bound_s)
        if whole is None:
            return
        answer, mine = self._claim(whole, at, asked=False)
        if mine:
            self._pool.submit(self._fetch, whole, at, answer)
        for selectors in wanted:
            expr = stale_expr(selectors, bound_s)
            if expr is None:
                continue
            part, todo = self._claim(expr, at, asked=False)
            if todo:
                numbers = {str(union.index(s)): str(i) for i, s in enumerate(selectors)}
                answer.add_done_callback(partial(self._renumber, expr, at, numbers, part))

    def _renumber(
        self,
        expr: str,
        at: float,
        numbers: dict[str, str],
        part: Future[tuple[Sample, ...]],
        whole: Future[tuple[Sample, ...]],
    ) -> None:
        """``part`` (the probe ``expr``) from the answer of the probe of all selectors:
        the samples of its selectors, numbered ``numbers`` (union index -> its index)."""
        error = whole.exception()
        if error is None:
            found = tuple(
                Sample(freeze({**s.labels, AGE_LABEL: numbers[i]}), s.value, s.timestamp)
                for s in whole.result()
                if (i := s.labels.get(AGE_LABEL)) in numbers
            )
            part.set_result(found)
            return
        with self._lock:  # asked again by whoever asks it (the cycle, on its own)
            if self._answers.get((at, expr)) is part:
                del self._answers[at, expr]
        part.set_exception(error)

    def _claim(self, expr: str, at: float, asked: bool) -> tuple[Future[tuple[Sample, ...]], bool]:
        """The answer to ``expr`` at ``at``, and whether the caller is to fetch it."""
        with self._lock:
            self.asked += asked
            known = self._answers.get((at, expr))
            if known is not None:
                self.answered += asked
                return known, False
            answer: Future[tuple[Sample, ...]] = Future()
            self._answers[at, expr] = answer
            return answer, True

    def forget(self) -> None:
        """Forget every answer (``PolicyLoop.evaluate``: once per step, before it prefetches;
        the step before has finished its actions, so nothing asks those instants again)."""
        with self._lock:
            self._answers = {}

    def _fetch(self, expr: str, at: float, answer: Future[tuple[Sample, ...]]) -> None:
        try:
            answer.set_result(super().query(expr, at=at))
        except Exception as exc:  # for every waiter; forgotten, so the next ask asks again
            with self._lock:
                if self._answers.get((at, expr)) is answer:
                    del self._answers[at, expr]
            answer.set_exception(exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def group_queries(group: Group, scheduled: bool, bound_s: float) -> Iterator[str]:
    """What the engine's cycle asks first in a run of ``group``: the stale-series probe of
    its policies (``gpuops.runtime.cycle.age_selectors`` with the group's freshness bound
    ``bound_s``, as ``Cycle._prefetch_ages`` asks it) and each policy's expression (a clear
    expression only while firing, so not here): prefetched by the what-if, answered from
    there when the cycle asks."""
    policies = _due(group, scheduled)
    probe = stale_expr(age_selectors(policies), bound_s)
    if probe is not None:
        yield probe
    for policy in policies:
        assert policy.expr is not None
        yield policy.expr


def _due(group: Group, scheduled: bool) -> list[Policy]:
    """The policies of ``group`` a run of it evaluates (cron ones, or the others)."""
    return [
        p for p in group.policies if p.expr is not None and (p.schedule is not None) == scheduled
    ]


def windows(expr: str) -> Iterator[float]:
    """The range (seconds) of every range selector and subquery of ``expr``."""
    found: list[float] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.MatrixSelector | promql_parser.SubqueryExpr):
            if node.range is not None:
                found.append(node.range.total_seconds())
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return iter(found)


def metric_names(rules: RuleSet) -> frozenset[str] | None:
    """The metric names every query of ``rules`` can read — each policy's ``expr``,
    ``clear_expr`` and population query (``limits.population``, else
    ``gpuops.model.guardrails.population_expr``), offset selectors included — so that the run writes
    only those series. None (write every series): a selector without a metric name (``{job=
    "x"}``, ``{__name__=~"..."}``), or a population that may read any series (a policy with
    ``max_fraction`` but neither ``target`` nor ``limits.population``, or whose results' sources
    cannot be told)."""
    names: set[str] = set()
    for policy in rules.policies():
        exprs = [policy.expr, policy.clear_expr]
        if policy.max_fraction is not None:
            if policy.population is None and not policy.target:
                return None  # its population's labels are its targets': known only at run time
            exprs.append(population_expr(policy))
        for expr in exprs:
            if expr is None:
                continue
            for selector in _selectors(expr):
                name = selector.name or next(
                    (
                        m.value
                        for m in selector.matchers.matchers
                        if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
                    ),
                    None,
                )
                if not name or selector.matchers.or_matchers:
                    return None
                names.add(name)
    return frozenset(names)


def _selectors(expr: str) -> list[promql_parser.VectorSelector]:
    """Every vector selector of ``expr`` (offset and ``@`` ones too)."""
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def check_windows(engine: Engine, scrape_interval_s: float) -> None:
    """Every window the policies read must hold two samples at this scrape interval (a
    `[2m]` window scraped every 90 s would see one, or none): else the run would measure
    policies that do not work as written."""
    for group in engine.rules.groups:
        for policy in group.policies:
            for key, expr in (("expr", policy.expr), ("clear_expr", policy.clear_expr)):
                for window in windows(expr) if expr else ():
                    if window < 2 * scrape_interval_s:
                        line = policy.key_lines.get(key)
                        where = (
                            f"{policy.source.rsplit(':', 1)[0]}:{line}" if line else policy.source
                        )
                        raise WhatifError(
                            f"{where}: policy {policy.name}, {key}: reads a {window:g} s "
                            f"window, which holds fewer than two samples at a scrape interval "
                            f"of {scrape_interval_s:g} s: use a scrape interval of at most "
                            f"{window / 2:g} s"
                        )


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
    all_series: bool = False,
) -> RunResult:
    """The same workload with the policies of ``rules`` evaluated by the engine at the
    virtual clock against ``prometheus_url`` (a fresh Prometheus with the remote-write
    receiver), acting on the cluster through the fleet's control API. ``workdir`` holds the
    engine's state file and audit spool (``workdir/audit``: every decision of the run).
    ``prometheus_cpu``: the CPU seconds Prometheus has used so far (for ``parts``).
    Only the series the rules read are written (``metric_names``), unless ``all_series``
    (for dashboards on the run's Prometheus data)."""
    clock = VirtualClock(start_time(hours, config.start_hour))
    recorder = Recorder()
    writer = RemoteWriter(prometheus_url)
    names = None if all_series else metric_names(load_rules(rules))
    fleet = VirtualFleet(
        config,
        int(clock.start_s * 1000),
        writer,
        scrape_interval_s,
        step_s=CLUSTER_STEP_S,
        recorder=recorder,
        record_interval_s=record_interval(scrape_interval_s),
        names=names,
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
            action_workers=ACTION_WORKERS,
        )
        loop = PolicyLoop(engine, clock, client)
        try:
            loop.open()
            check_windows(engine, scrape_interval_s)
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
            client.close()
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
        (client.asked, client.answered),
        (len(writer.series.labels), writer.samples_sent),
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


OFF_PROCESS_GPU_HOURS = 1000.0
"""From how many GPU-hours (GPUs x virtual hours) on the baseline runs in a process of its
own, beside the "on" run: a 500-GPU day's baseline (~40 s) then costs no wall time, as the
"on" run, in lockstep, leaves a core free much of the time; a small one is not worth the
~2 s of CPU a fresh interpreter takes to import the engine."""


def _baseline(
    stack: ExitStack, config: FleetConfig, hours: float, scrape_interval_s: float
) -> Callable[[], RunResult]:
    """The policies-off run: started in a Python process of its own (nothing shared but
    ``config``, pickled through a pipe; not ``multiprocessing``, which would run the
    caller's main module again) when it is large, else run here now. Returns how to wait
    for its result."""
    gpus = sum(p.nodes * p.gpus_per_node for p in config.pools)
    if gpus * hours < OFF_PROCESS_GPU_HOURS:
        done = run_off(config, hours, scrape_interval_s)
        return lambda: done
    child = stack.enter_context(
        subprocess.Popen(
            [sys.executable, "-c", "from gpuops.sim.whatif import _off_child; _off_child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(pickle.dumps((config, hours, scrape_interval_s)))
    child.stdin.close()

    def result() -> RunResult:
        assert child.stdout is not None
        out = child.stdout.read()
        if child.wait() != 0:
            raise WhatifError(f"the policies-off run failed (exit status {child.returncode})")
        found = pickle.loads(out)
        assert isinstance(found, RunResult)
        return found

    return result


def _off_child() -> None:
    """The policies-off run in a child process (``_baseline``): arguments pickled on stdin,
    the ``RunResult`` pickled on stdout."""
    config, hours, scrape_interval_s = pickle.loads(sys.stdin.buffer.read())
    done = run_off(config, hours, scrape_interval_s)
    sys.stdout.buffer.write(pickle.dumps(done))


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
    all_series: bool = False,
) -> Whatif:
    """Run ``config`` for ``hours`` without and with the policies of ``rules`` (writing
    every series to Prometheus with ``all_series``, else only those the rules read)."""
    with (
        tempfile.TemporaryDirectory(prefix="gpuops-whatif-", dir=_scratch()) as tmp,
        tempfile.TemporaryDirectory(prefix="gpuops-whatif-prometheus-") as tmp_prom,
    ):
        engine_dir = workdir / "engine" if workdir else Path(tmp)
        prom_dir = workdir / "prometheus" if workdir else Path(tmp_prom)
        prom_dir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            baseline = _baseline(stack, config, hours, scrape_interval_s)
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
                    all_series,
                )
            off = baseline()
        if progress is not None:
            progress("off", hours * 3600.0)
    return Whatif(config.name, hours, config.seed, tuple(map(str, rules)), off, on)
