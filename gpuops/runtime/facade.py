"""``Engine``: the small facade over the runtime package.

It opens the state backend (``gpuops.runtime.backend``), builds the collaborators and hands each
the store and the gate: the rulebook (load, watch, reload), the cycle (query → evaluate → judge
→ commit), the gate (the only executor caller: write-ahead audit, checks at execution time,
workers per executor, outcomes, resume), approvals, quota requests and the alert inbox. It owns
every runtime thread — the scheduled jobs (``gpuops.runtime.jobs``), the inbox's worker, the
leadership — and the API only calls it. Used by ``gpuops engine run``, the demo, the what-if,
the API and the tests; both clocks are injected.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuops.actions.registry import ExecutorRegistry
from gpuops.actions.retry import RetryPolicy
from gpuops.audit import AuditLog
from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import Decision, SkippedEvaluation, freeze
from gpuops.model.evaluation.step import Freshness
from gpuops.model.health.catalogue_file import load_catalogue
from gpuops.model.rules.model import Group, Policy, RuleSet
from gpuops.runtime.alerts import EPISODE_MEMORY_S, AlertInbox
from gpuops.runtime.approvals import Approvals
from gpuops.runtime.backend import open_store, previous_run
from gpuops.runtime.batch import BatchRunner, FleetView
from gpuops.runtime.controls import Controls, Locks
from gpuops.runtime.cycle import Cycle
from gpuops.runtime.fleets import configured_fleet
from gpuops.runtime.gate import DecisionListener, Gate, Told
from gpuops.runtime.health import HealthInbox
from gpuops.runtime.jobs import Jobs
from gpuops.runtime.ladder import RepairLadder
from gpuops.runtime.leadership import Change, Leadership
from gpuops.runtime.metrics import EngineMetrics
from gpuops.runtime.outages import OutOfService
from gpuops.runtime.quota import POLICY as QUOTA_POLICY
from gpuops.runtime.quota import QuotaManager
from gpuops.runtime.reloaded import expire_held_fires
from gpuops.runtime.rollouts import BatchHost
from gpuops.runtime.rulebook import ReloadResult, Rulebook
from gpuops.settings import EngineConfig
from gpuops.sources import MetricsSource
from gpuops.sources.prometheus import PrometheusClient
from gpuops.store.errors import StateError
from gpuops.store.postgres import PostgresStore

log = logging.getLogger(__name__)

DECISION_MEMORY_S = 30 * 86400.0
"""How long finished decisions stay in the state file (for the API's queries and explain)."""

BATCH_KICK_S = 5.0
"""How often the leader looks for batch operations stored ``running`` that it does not drive
(``gpuops.runtime.rollouts``): one another replica drove before it lost its lease."""

RECONCILE_S = 5.0
"""How often an audit spool that could not be written is tried again (while it cannot, no
action runs)."""


class _AlertItem(BaseModel):
    """One ``alerts[]`` item of an Alertmanager webhook notification, as a mapping handed to
    ``Engine.handle_alert``: checked as the receiver checks it (``gpuops.api.schemas.Alert``,
    which the runtime cannot import)."""

    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str = Field(max_length=64)
    endsAt: str = Field(default="", max_length=64)
    generatorURL: str = Field(default="", max_length=4096)
    fingerprint: str = Field(min_length=1, max_length=64)


def alert_of(item: Alert | Mapping[str, Any]) -> Alert:
    """``item`` as the engine takes it: an ``Alert`` as it is, an Alertmanager item (a mapping:
    ``status``, ``labels``, ``startsAt``, ``fingerprint``...) as the receiver builds it from
    one. ``ValueError`` naming every problem of a mapping it cannot take."""
    if isinstance(item, Alert):
        return item
    try:
        checked = _AlertItem.model_validate(dict(item))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ValueError(f"not an Alertmanager alert: {problems}") from None
    return Alert(
        fingerprint=checked.fingerprint,
        status=AlertStatus(checked.status),
        labels=freeze(checked.labels),
        annotations=freeze(checked.annotations),
        starts_at=checked.startsAt,
        ends_at=checked.endsAt,
        generator_url=checked.generatorURL,
    )


def _out_of_service(
    config: EngineConfig, source: MetricsSource, clock: Callable[[], float]
) -> OutOfService | None:
    """What tells the ladder which nodes are out of service (``pacing.unavailable``)."""
    pacing = config.health.ladder.pacing
    if pacing.unavailable is None:
        return None
    return OutOfService(
        source, pacing.unavailable, max_sample_age=pacing.max_sample_age, clock=clock
    )


class Engine:
    """One engine instance. ``start`` schedules it; ``evaluate_group`` runs one cycle (tests)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        executors: ExecutorRegistry | None = None,
        audit: AuditLog | None = None,
        prometheus: MetricsSource | None = None,
        metrics: EngineMetrics | None = None,
        listener: DecisionListener | None = None,
        action_workers: int = 4,
        action_retry: RetryPolicy | None = None,
        fleet: FleetView | None = None,
    ) -> None:
        """``action_workers``: concurrent actions per executor; ``action_retry``: how often
        and how fast ``execute`` tries a temporarily failing action within one decision;
        ``clock``: the wall clock (evaluation times, audit); ``monotonic``: what intervals are
        timed by (docs/policies.md, "Clock"); ``fleet``: what the batch operations it hosts
        are planned over (None: the configuration's ``batch``)."""
        self.config = config
        self.clock = clock
        self.monotonic = monotonic
        # read before the audit log marks its spool; an audit log handed in has marked it
        # already, so the spool tells nothing and its caller answers for the state file
        ran_before = previous_run(config) if audit is None else None
        self.metrics = metrics or EngineMetrics.create()
        self.registry = executors or ExecutorRegistry.from_entry_points()
        self.audit = audit or AuditLog(
            config.audit.settings(),
            host_name=socket.gethostname(),
            registry=self.metrics.registry,
        )
        self.prometheus = prometheus or PrometheusClient(
            config.prometheus.url, timeout_s=config.prometheus.timeout
        )
        self.replica = config.state.replica or socket.gethostname()
        try:
            self.store, lease = open_store(config, ran_before, self.replica)
        except StateError:
            if audit is None:
                self.audit.close()
            raise
        self.leadership = Leadership(
            lease,
            replica=self.replica,
            lease_s=config.state.lease,
            renew_s=config.state.renew_interval,
            monotonic=monotonic,
            on_change=self._leadership_changed,
        )
        if isinstance(self.store, PostgresStore):
            self.store.fence = self.leadership.fence
        self.metrics.leader.set(1 if self.leadership.solo else 0)
        self._alerts_started = False
        self._loaded: frozenset[str] = frozenset()
        """The policies of the rule set loaded last (``_rules_changed``)."""
        self.controls = Controls(self.store, config.guardrails, self.metrics, clock)
        self.locks = Locks()
        self.rulebook = Rulebook(config.rules, self.registry, self.metrics, clock)
        self.rulebook.on_change = self._rules_changed
        self.gate = Gate(
            settings=config.guardrails,
            executor_settings=config.executors,
            store=self.store,
            audit=self.audit,
            registry=self.registry,
            metrics=self.metrics,
            controls=self.controls,
            locks=self.locks,
            clock=clock,
            policy=self._policy,
            population=lambda policy, decision: self.cycle.population(
                policy, clock(), (decision,), reuse=False
            ),
            listener=listener,
            workers_per_executor=action_workers,
            retry=action_retry or RetryPolicy(),
            leading=self.leadership.leading,
            told=Told(logging.getLevelName(config.log.quiet_level.upper())),
        )
        self.cycle = Cycle(
            store=self.store,
            prometheus=self.prometheus,
            gate=self.gate,
            controls=self.controls,
            locks=self.locks,
            settings=config.guardrails,
            metrics=self.metrics,
            clock=clock,
            skipped=self._skipped,
            cleared=lambda decisions, now: self.approvals.cancel(decisions, now),
            freshness=self._freshness,
        )
        self.approvals = Approvals(
            store=self.store,
            rulebook=self.rulebook,
            cycle=self.cycle,
            gate=self.gate,
            locks=self.locks,
            settings=config.guardrails,
            metrics=self.metrics,
            clock=clock,
        )
        self.quota = QuotaManager(
            settings=config.api.quota,
            store=self.store,
            cycle=self.cycle,
            controls=self.controls,
            approval_ttl=config.guardrails.approval_ttl,
            clock=clock,
            require_leader=self.leadership.require,
        )
        self.alerts = AlertInbox(
            store=self.store,
            rulebook=self.rulebook,
            cycle=self.cycle,
            clock=clock,
            queue_size=config.api.alert_queue_size,
            registry=self.metrics.registry,
            require_leader=self.leadership.require,
        )
        self.gate.on_outcome(self.alerts.fire_finished)
        self.health = HealthInbox(
            catalogue=load_catalogue(config.health.xid_overrides),
            store=self.store,
            alerts=self.alerts,
            clock=clock,
            registry=self.metrics.registry,
            max_event_age=config.health.max_event_age,
            profiles=config.health.profiles,
            default_profile=config.health.default_profile,
            domains=config.health.ladder.pacing.domains,
            known_domains=self.store.domains(),
        )
        self.gate.on_outcome(self.health.outcome)
        self.ladder = RepairLadder(
            settings=config.health.ladder,
            store=self.store,
            gate=self.gate,
            clock=clock,
            stopped=self._batch_stopped,
            returned=self.health.returned,
            registry=self.metrics.registry,
            out_of_service=_out_of_service(config, self.prometheus, clock),
        )
        self.gate.on_outcome(self.ladder.outcome)
        self.batches = BatchRunner(
            store=self.store,
            gate=self.gate,
            clock=clock,
            stopped=self._batch_stopped,
            registry=self.registry,
            leading=self.leadership.leading,
            self_approval=config.batch.self_approval,
        )
        self.rollouts = BatchHost(
            self.batches,
            fleet=fleet if fleet is not None else configured_fleet(config.batch),
            folder=config.batch.folder or Path.cwd(),
            leading=self.leadership.leading,
        )
        self._jobs: Jobs | None = None
        self._stopped = False

    # --- rules -----------------------------------------------------------------------------
    @property
    def rules(self) -> RuleSet:
        return self.rulebook.rules

    def _policy(self, name: str) -> Policy | None:
        """The policy a decision of ``name`` is held by at the gate: a loaded one, or the
        quota flow's (None: the policy was removed from the rule set)."""
        found = self.rulebook.policy(name)
        if found is None and name == QUOTA_POLICY:
            return self.quota.policy()
        return found

    def _freshness(self, policy: Policy) -> Freshness:
        """The freshness bounds of ``policy``'s group (docs/policies.md, "Fresh data")."""
        group = next((g for g in self.rules.groups if g.name == policy.group), None)
        if group is None:
            return self.config.prometheus.freshness(math.inf)
        return self.config.prometheus.freshness(group.interval_s, group.max_sample_age_s)

    def reload(self, strict: bool = False) -> ReloadResult:
        return self.rulebook.reload(strict)

    def check_reload(self) -> None:
        self.rulebook.check_reload()

    def _rules_changed(self) -> None:
        names = frozenset(p.name for p in self.rules.policies())
        self.cycle.rules_changed(names)
        returned, self._loaded = names - self._loaded, names
        if returned and self.leadership.leading():
            self._expire_held_fires(returned)
        if self._jobs is not None:
            self._jobs.schedule_groups()

    def _expire_held_fires(self, names: frozenset[str]) -> None:
        """The fires held while the policies ``names`` were not loaded, past
        ``guardrails.action_max_age`` (``gpuops.runtime.reloaded``)."""
        grace = self.config.guardrails.action_max_age
        expire_held_fires(self.store, self.locks, names, self.clock(), grace)

    # --- controls and health ----------------------------------------------------------------
    def kill_switch_on(self) -> bool:
        return self.controls.kill_switch_on()

    def paused(self) -> bool:
        return self.controls.paused()

    def _batch_stopped(self) -> str | None:
        """Why no batch step may start now (``gpuops.runtime.batch``), or None."""
        if self.kill_switch_on():
            return "the kill switch is on"
        if self.paused():
            return "the engine is paused"
        return None

    def set_control(self, name: str, on: bool, user: str) -> None:
        """Turn ``kill_switch`` or ``paused`` on or off (persisted: survives a restart)."""
        self.leadership.require()
        self.controls.set(name, on, user)

    def problem(self) -> str | None:
        """Why the engine cannot act now (its audit spool is not writable), or None."""
        return self.gate.problem

    def degraded(self) -> dict[str, str]:
        """The policies that cannot be evaluated because their stored state cannot be read,
        with the reason (``/healthz`` names them; docs/state.md); a policy no longer loaded
        is not named."""
        return {p: r for p, r in dict(self.cycle.unreadable).items() if self.rules.policy(p)}

    # --- evaluation, alerts, approvals ------------------------------------------------------
    def evaluate_group(self, group: Group, scheduled: bool = False) -> None:
        self.cycle.evaluate_group(group, scheduled)

    def evaluate_policy(self, policy: Policy, now: float | None = None) -> list[Decision]:
        return self.cycle.evaluate_policy(policy, now)

    def handle_alert(self, alert: Alert | Mapping[str, Any]) -> list[Decision]:
        """Decide on one alert now: a ``gpuops.model.alerts.Alert``, or the Alertmanager item
        as a mapping (checked as the receiver checks it, ``alert_of``; ``ValueError`` when it
        is not one)."""
        return self.alerts.handle(alert_of(alert))

    def grant(self, decision_id: str, user: str) -> Decision:
        self.leadership.require()
        return self.approvals.grant(decision_id, user)

    def deny(self, decision_id: str, user: str) -> Decision:
        self.leadership.require()
        return self.approvals.deny(decision_id, user)

    def retry(self, decision_id: str) -> Decision:
        """Decide again, at the next evaluation, the target of an action that failed
        (``gpuops.runtime.gate.Gate.retry``)."""
        self.leadership.require()
        return self.gate.retry(decision_id)

    def expire_approvals(self) -> list[Decision]:
        """Expire the approvals whose time ran out (the leader's; a standby leaves it)."""
        if not self.leadership.leading():
            return []
        return self.approvals.expire()

    def _skipped(self, skipped: SkippedEvaluation) -> None:
        if skipped.held:
            log.warning("%s: %s (nothing decided for those)", skipped.policy, skipped.error)
        else:
            log.warning(
                "skipped %s: %s (no state changed, nothing acted on)",
                skipped.policy,
                skipped.error,
            )
        self.audit.skipped(skipped)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no action is running and no node climbs the remediation ladder (tests
        and shutdown)."""
        return self.gate.wait_idle(timeout) and self.ladder.wait_idle(timeout)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Check the guardrail windows decode (``StateError`` when not), load rules (a bad
        rule set at start is fatal), start audit, reconcile the audit with
        the state file and resume interrupted actions, start the alert inbox and the scheduler
        (groups, approvals expiry, quota ends, pruning, rule watch, audit retry). Every
        configured executor is built first: ``ExecutorsRefused`` when one cannot be."""
        self.gate.build_executors()
        self.store.guardrail_state()  # engine-wide rows decode, or StateError (docs/state.md)
        self.reload(strict=True)
        self.audit.start()
        if self.leadership.solo:
            self.gate.resume()
            self._start_alerts()
            self.rollouts.kick()  # the operations a stop or a kill left running
        self._jobs = jobs = Jobs(
            wall=self.clock,
            monotonic=self.monotonic,
            leading=self.leadership.leading,
            groups=lambda: self.rules.groups,
            evaluate=self.evaluate_group,
            epochs=self.cycle.epochs,
            stepped=self._clock_stepped,
        )
        jobs.schedule_groups()
        periodic: tuple[tuple[Callable[[], object], float, str], ...] = (
            (self.expire_approvals, 30.0, "gpuops-approvals-expiry"),
            (self._quota_tick, self.config.api.quota.check_interval, "gpuops-quota"),
            (self._reconcile, RECONCILE_S, "gpuops-audit-reconcile"),
            (self.check_reload, self.config.reload_check_interval, "gpuops-rules-watch"),
            (self.ladder.tick, self.config.health.ladder.interval, "gpuops-health-ladder"),
        )
        for func, interval_s, job_id in periodic:
            jobs.every(job_id, func, interval_s, first_in=interval_s)
        jobs.every("gpuops-prune", self.prune, 6 * 3600.0)
        jobs.every("gpuops-batch", self.rollouts.kick, BATCH_KICK_S, first_in=BATCH_KICK_S)
        jobs.start()
        self.leadership.start()  # one renewal now: a sole replica leads from its start

    # --- leadership (docs/ha.md) -------------------------------------------------------------
    def leading(self) -> bool:
        """Whether this replica evaluates and acts (always, with SQLite)."""
        return self.leadership.leading()

    def _leadership_changed(self, change: Change) -> None:
        """Audit and count the change; a new leader first resumes what the old one left
        (reconcile, the ``started`` actions: executors dedupe on decision ids), then its
        scheduled jobs run (they check ``leading()``)."""
        self.metrics.leader.set(1 if change.elected else 0)
        self.metrics.leadership_changes.labels("elected" if change.elected else "demoted").inc()
        self.audit.leadership(
            change.elected, change.replica, change.epoch, change.reason, self.clock()
        )
        if change.elected:
            self._expire_held_fires(self._loaded)
            self.gate.resume()
            self._start_alerts()
            self.rollouts.kick()  # the operations the previous leader was driving

    def _start_alerts(self) -> None:
        """Start the inbox's worker once; at a later election adopt what the inbox holds (what
        the replica that led meanwhile received and did not handle)."""
        if not self._alerts_started:
            self._alerts_started = True
            self.alerts.start()
        else:
            self.alerts.adopt()

    def _clock_stepped(self, step_s: float) -> None:
        """The scheduler saw the wall clock step by ``step_s`` seconds: count it and audit it
        once (``gpuops.runtime.jobs`` re-anchors the groups' grids)."""
        direction = "forward" if step_s > 0 else "backward"
        self.metrics.clock_steps.labels(direction).inc()
        self.audit.clock_step(step_s, self.clock())

    def _quota_tick(self) -> None:
        try:
            self.quota.tick()
        except Exception:  # keep ticking: the next tick retries
            log.exception("quota requests check failed")

    def _reconcile(self) -> None:
        if self.gate.problem is not None:
            self.gate.reconcile()

    def prune(self) -> None:
        """Keep the state file bounded: decisions older than ``DECISION_MEMORY_S`` go (the
        audit trail, not the state file, is the record of the past)."""
        gone = self.store.prune(self.clock() - DECISION_MEMORY_S)
        memory = max(DECISION_MEMORY_S, EPISODE_MEMORY_S)
        gone += self.store.prune_alert_episodes(self.clock() - memory)
        gone += self.store.prune_health_events(self.clock() - memory)
        if gone:
            log.info("pruned %d old decisions and approvals from the state file", gone)

    def stop(self) -> None:
        """Stop scheduling and the alert inbox, let running actions finish, close audit and
        state (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._jobs is not None:
            self._jobs.shutdown()
            self._jobs = None
        self.alerts.stop()
        self.rollouts.stop()  # between two steps; they stay running for the next leader
        self.ladder.stop()
        self.gate.stop()
        self.leadership.stop()  # after the last action: a standby then resumes nothing twice
        self.audit.close()
        self.store.close()
