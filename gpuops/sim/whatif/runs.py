"""The two runs of a what-if, each on its own cluster: ``run_off`` (the cluster and its scheduler
alone) and ``run_on`` (the real engine evaluating the policies at a virtual clock against a
real Prometheus fed by remote write, acting through the fleet's control API), and what each
achieved (``RunResult``).

Called by ``gpuops.sim.whatif.both`` (both runs of one workload), ``gpuops fleet run``
(``gpuops.cli.fleet`` steps and observes as ``run_off`` does) and the benchmark.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests

from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, Transition
from gpuops.model.health.catalogue_file import shipped_catalogue
from gpuops.model.health.events import EventKind, HealthEvent
from gpuops.model.health.ladder import Stage
from gpuops.model.rules.loader import load_rules
from gpuops.runtime import Engine
from gpuops.runtime.health import FAULT_TRIGGER
from gpuops.settings import (
    AuditConfig,
    EngineConfig,
    HealthSettings,
    LadderAction,
    LadderSettings,
    PrometheusSettings,
    ValidationSettings,
)
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.remotewrite import RemoteWriter
from gpuops.sim.fleet.report import Point, Recorder, RunReport
from gpuops.sim.fleet.rollout import RolloutReport, RolloutSpec
from gpuops.sim.fleet.virtual import VirtualFleet
from gpuops.sim.reliability import FaultPlan, Injector, ReliabilityFigures, ladder_window_s
from gpuops.sim.whatif.attribution import Attribution, attribute
from gpuops.sim.whatif.errors import WhatifError
from gpuops.sim.whatif.lockstep import LockstepPrometheus
from gpuops.sim.whatif.loop import ACTION_TIMEOUT_S, ACTION_WORKERS, PolicyLoop, VirtualClock
from gpuops.sim.whatif.queries import check_windows, metric_names

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
    attribution: Attribution = Attribution()
    """Which policy stopped or acted on which jobs ("on" run)."""
    rollout: RolloutReport | None = None
    """What a batch operation rolled over the cluster cost ("on" run with ``--batch``)."""
    reliability: ReliabilityFigures | None = None
    """What injected GPU faults cost (``--faults``)."""


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
    config: FleetConfig,
    hours: float,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
    faults: FaultPlan | None = None,
) -> RunResult:
    """The baseline: the cluster and its scheduler alone (nothing queries it, so nothing is
    written to Prometheus); with ``faults``, a person on call repairs what fails."""
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
    injector = _injector(faults, fleet, config, hours, manual=True)
    cpu = time.process_time()
    for t in _hourly(hours):
        fleet.run_until(t)
    wall = time.monotonic() - started
    parts = {
        "fleet step": fleet.step_time.pair(),
        "record": fleet.record_time.pair(),
        "all": (wall, time.process_time() - cpu),
    }
    return RunResult(
        recorder.report(fleet.cluster),
        tuple(recorder.points),
        wall,
        {},
        {},
        parts,
        reliability=None if injector is None else injector.figures(),
    )


def _injector(
    faults: FaultPlan | None, fleet: VirtualFleet, config: FleetConfig, hours: float, manual: bool
) -> Injector | None:
    """The faults of ``faults`` injected into ``fleet``'s cluster (the same ones in both runs:
    drawn from the fleet's seed)."""
    if faults is None:
        return None
    injector = Injector(
        faults, fleet.cluster, hours * 3600.0, shipped_catalogue(), config.seed, manual=manual
    )
    fleet.stepped.append(injector)
    return injector


class _Tally:
    """The decisions and outcomes of the "on" run (the engine's ``DecisionListener``); the
    quarantines and remediation steps told to the fault injection."""

    def __init__(self, injector: Injector | None = None, start_s: float = 0.0) -> None:
        """``start_s``: the epoch second of the run's virtual second 0."""
        self.decisions: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.policies: dict[str, str] = {}
        """Decision id -> its policy."""
        self.injector = injector
        self.start_s = start_s

    def __call__(self, decision: Decision, outcome: Outcome | None) -> None:
        self.policies[decision.id] = decision.policy
        if outcome is None:
            self.decisions[f"{decision.policy} {decision.verdict}"] += 1
        elif decision.action is not None:
            key = f"{decision.policy} {decision.action.type} {outcome.status.value}"
            self.outcomes[key] += 1
            if self.injector is not None:
                self._faults(self.injector, decision, outcome)

    def _faults(self, injector: Injector, decision: Decision, outcome: Outcome) -> None:
        assert decision.action is not None
        verb = decision.action.type
        node = decision.target.labels.get("node", "")
        if verb in ("reset_gpu", "reboot") and outcome.status is not OutcomeStatus.SKIPPED:
            injector.attempted(verb)
        elif (
            verb == "migrate"
            and outcome.ok
            and decision.evidence.expr == FAULT_TRIGGER
            and decision.transition is Transition.FIRE
            and outcome.changed.get("drained") is True
        ):
            injector.quarantined(node, decision.at - self.start_s, outcome.changed)


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
    rollout: RolloutSpec | None = None,
    faults: FaultPlan | None = None,
) -> RunResult:
    """The same workload with the policies of ``rules`` evaluated by the engine at the
    virtual clock against ``prometheus_url`` (a fresh Prometheus with the remote-write
    receiver), acting on the cluster through the fleet's control API. ``workdir`` holds the
    engine's state file and audit spool (``workdir/audit``: every decision of the run).
    ``prometheus_cpu``: the CPU seconds Prometheus has used so far (for ``parts``).
    Only the series the rules read are written (``metric_names``), unless ``all_series``
    (for dashboards on the run's Prometheus data). ``rollout``: a batch operation rolled
    over the cluster meanwhile (``gpuops.sim.fleet.rollout``). ``faults``: GPU faults
    injected meanwhile, pushed to the engine as the node agent pushes them, every pool's
    profile ``full`` (the remediation ladder heals through the fleet)."""
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
        rollout=rollout,
    )
    injector = _injector(faults, fleet, config, hours, manual=False)
    tally = _Tally(injector, clock.start_s)
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
            health=HealthSettings() if faults is None else _health(config, faults),
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
                if injector is None:
                    fleet.run_until(t)
                else:
                    _run_pushing(fleet, engine, clock, injector, t)
                loop.evaluate(t)
                if injector is not None:
                    _handed_over(engine, injector, t)
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
        attribute(fleet.cluster.causes, tally.policies),
        None if fleet.rollout is None else fleet.rollout.report,
        None if injector is None else injector.figures(),
    )


def _health(config: FleetConfig, faults: FaultPlan) -> HealthSettings:
    """Every pool's faulty GPUs quarantined and repaired by the remediation ladder, whose
    steps and health check the fleet does (``gpuops.sim.fleet.health``). The ladder's window
    of remediations (``ladder_window_s``) is scaled with the fault rate, so that a node's
    second fault within it is as rare as at the published rates."""
    fleet = LadderAction(executor="fleet")
    return HealthSettings(
        profiles={pool.name: "full" for pool in config.pools},
        ladder=LadderSettings(
            reset_gpu=fleet,
            reboot=fleet,
            validation=ValidationSettings(executor="fleet"),
            window=ladder_window_s(faults),
        ),
    )


def _run_pushing(
    fleet: VirtualFleet, engine: Engine, clock: VirtualClock, injector: Injector, t: float
) -> None:
    """Run the fleet to virtual second ``t`` one cluster step at a time, handing the engine
    what the node agents pushed at the end of each step (as they push at once, not at the
    policies' evaluation), its actions finished before the fleet goes on."""
    while fleet.now < t:
        at = min(t, (math.floor(fleet.now / CLUSTER_STEP_S) + 1) * CLUSTER_STEP_S)
        fleet.run_until(at)
        if injector.outbox or injector.cleared:
            clock.t = at
            _push(engine, clock, injector)
            if not engine.wait_idle(ACTION_TIMEOUT_S):
                raise WhatifError(
                    f"actions on faults pushed at virtual second {at:.0f} did not finish "
                    f"within {ACTION_TIMEOUT_S:.0f} s"
                )


def _push(engine: Engine, clock: VirtualClock, injector: Injector) -> None:
    """What the node agents would have pushed since the last step, to the engine's health
    inbox (as ``POST /api/v1/health/events`` hands it), the alerts it raised decided; the
    nodes a person repaired after a hand-over cleared on the ladder."""
    events = injector.take_events()
    if events:
        engine.health.submit(
            [
                HealthEvent(
                    id=f"sim:{e.node}:{e.gpu}:{e.code}:{e.at:.3f}",
                    node=e.node,
                    gpu=e.gpu,
                    kind=EventKind.XID,
                    at=clock.start_s + e.at,
                    xid=e.code,
                    pool=injector.pools.get(e.node, ""),
                )
                for e in events
            ]
        )
        if not engine.alerts.wait_idle(ACTION_TIMEOUT_S):
            raise WhatifError(
                f"the alerts of {len(events)} pushed health events were not decided within "
                f"{ACTION_TIMEOUT_S:.0f} s"
            )
    for node in injector.take_cleared():
        engine.ladder.clear(node, "the person on call")


def _handed_over(engine: Engine, injector: Injector, t: float) -> None:
    for repair in engine.ladder.repairs():
        if repair.stage is Stage.NEEDS_HUMAN:
            injector.hand_over(repair.node, t)
