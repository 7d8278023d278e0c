"""The live engine: the one module that sees the whole flow (DESIGN.md section 2).

Loads rules, schedules each group on its interval (APScheduler), queries Prometheus, runs the
pure evaluation and guardrails, persists state before acting, runs actions on a worker pool
through the executors, and audits every decision, outcome and skipped evaluation. Used by
``gpuops engine run``, the demo and the API. The clock is injected.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from engine.actions.base import Executor, ExecutorRegistry, execute
from engine.approvals import ApprovalFlow
from engine.audit import AuditLog, AuditSettings
from engine.config import EngineConfig
from engine.decisions import (
    Decision,
    Outcome,
    OutcomeStatus,
    SkippedEvaluation,
    Transition,
    Verdict,
    decision_id,
)
from engine.evaluation import (
    Freshness,
    PolicyState,
    QueryResult,
    evaluate,
    evaluate_alert,
    failed,
    settle,
)
from engine.guardrails import (
    RETRY_S,
    Context,
    forget_action,
    judge_all,
    population_expr,
    retry_time,
)
from engine.metrics import EngineMetrics
from engine.prometheus import PrometheusClient, QueryError
from engine.records import decision_doc, decision_from_doc, outcome_doc
from engine.rulecheck import load_checked, refuse_dropping_every_policy
from engine.rules.model import Group, Policy, RuleError, RulesError, RuleSet, cron_time
from engine.state import StateStore

log = logging.getLogger(__name__)

DecisionListener = Callable[[Decision, Outcome | None], None]

DECISION_MEMORY_S = 30 * 86400.0
"""How long finished decisions stay in the state file (for the API's queries and explain)."""


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    policies: int
    errors: tuple[str, ...] = ()


class Engine(ApprovalFlow):
    """One engine instance. ``start`` schedules it; ``evaluate_group`` runs one cycle (tests)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        clock: Callable[[], float] = time.time,
        executors: ExecutorRegistry | None = None,
        audit: AuditLog | None = None,
        prometheus: PrometheusClient | None = None,
        metrics: EngineMetrics | None = None,
        listener: DecisionListener | None = None,
        action_workers: int = 4,
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics or EngineMetrics.create()
        self.registry = executors or ExecutorRegistry.from_entry_points()
        self.audit = audit or AuditLog(
            AuditSettings(
                spool_dir=config.audit.spool_dir,
                elasticsearch_url=config.audit.elasticsearch_url,
            ),
            host_name=socket.gethostname(),
            registry=self.metrics.registry,
        )
        self.prometheus = prometheus or PrometheusClient(
            config.prometheus.url, timeout_s=config.prometheus.timeout
        )
        self.store = StateStore(config.state_file)
        self.listener = listener
        self.rules = RuleSet()
        self._rule_mtimes: dict[str, float] = {}
        self._executors: dict[str, Executor] = {}
        self._lock = threading.RLock()  # one evaluation judges and persists at a time
        self._pool = ThreadPoolExecutor(action_workers, thread_name_prefix="gpuops-action")
        self._pending: set[Future[None]] = set()
        self._scheduler: BackgroundScheduler | None = None
        self._stopped = False
        self._epochs: dict[str, float] = {}  # group -> clock at its first scheduled run
        self._promtool_warned = False
        self._policy_locks: dict[str, threading.Lock] = {}

    # --- rules ---------------------------------------------------------------------------
    def reload(self, strict: bool = False) -> ReloadResult:
        """Load the rule files; on any error keep the running rules and report file:line
        (``strict``: raise the ``RulesError`` instead, for the first load)."""
        try:
            # the same checks as `gpuops rules check` (issue 10): engine.rulecheck
            rules = load_checked(
                self.config.rules, self.registry, without_promtool=self._no_promtool
            )
            refuse_dropping_every_policy(self.rules, rules)  # issue 10: `groups: []`
        except (RulesError, RecursionError, OSError, ValueError) as exc:
            self.metrics.reloads.labels("failure").inc()
            if not isinstance(exc, RulesError):  # a loader bug must not take the rules down
                log.exception("rules not reloaded: the loader failed")
                exc = RulesError([RuleError("(rules)", 0, f"{type(exc).__name__}: {exc}")])
            if strict:
                raise exc from None
            for err in exc.errors:
                log.error("rules not reloaded: %s", err)
            return ReloadResult(
                False, sum(1 for _ in self.rules.policies()), tuple(map(str, exc.errors))
            )
        with self._lock:
            self.rules = rules
            self._rule_mtimes = self._mtimes()
        count = sum(1 for _ in rules.policies())
        self.metrics.reloads.labels("success").inc()
        self.metrics.rules_loaded.set(count)
        self.metrics.last_reload_success.set(self.clock())
        log.log(
            logging.INFO if count else logging.WARNING,
            "loaded %d policies in %d groups from %s",
            count,
            len(rules.groups),
            ", ".join(rules.files) or "no files",
        )
        if self._scheduler is not None:
            self._schedule_groups()
        return ReloadResult(True, count)

    def _no_promtool(self, exc: Exception) -> None:
        """PromQL is checked by a real parser (promtool) when there is one; said once if not."""
        if not self._promtool_warned:
            log.warning("PromQL of reloaded rules not checked: %s", exc)
            self._promtool_warned = True

    def _mtimes(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for path in self.config.rules:
            files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
            for f in files:
                try:
                    found[str(f)] = f.stat().st_mtime
                except OSError:
                    found[str(f)] = math.nan
        return found

    def check_reload(self) -> None:
        """Reload when a rule file was added, removed or changed since the last attempt."""
        current = self._mtimes()
        if current != self._rule_mtimes:
            self._rule_mtimes = current
            self.reload()

    # --- controls --------------------------------------------------------------------------
    def kill_switch_on(self) -> bool:
        f = self.config.guardrails.kill_switch_file
        return self.store.control("kill_switch") is not None or bool(f and f.exists())

    def paused(self) -> bool:
        return self.store.control("paused") is not None

    def set_control(self, name: str, on: bool, user: str) -> None:
        """Turn ``kill_switch`` or ``paused`` on or off (persisted: survives a restart)."""
        if name not in ("kill_switch", "paused"):
            raise ValueError(f"unknown control {name!r} (known: kill_switch, paused)")
        self.store.set_control(name, f"{user}@{self.clock():.0f}" if on else None)
        gauge = self.metrics.kill_switch if name == "kill_switch" else self.metrics.paused
        gauge.set(1 if on else 0)
        log.warning("%s turned %s by %s", name, "on" if on else "off", user)

    # --- evaluation ------------------------------------------------------------------------
    def evaluate_group(self, group: Group, scheduled: bool = False) -> None:
        started = time.monotonic()
        now = cron_time(self.clock()) if scheduled else self._tick(group)
        for policy in group.policies:
            if policy.expr is None or (policy.schedule is not None) != scheduled:
                continue
            try:
                self.evaluate_policy(policy, now)
            except Exception:  # one broken policy must not stop the others
                log.exception("evaluation of policy %s failed", policy.name)
        self.metrics.evaluation_duration.labels(group.name).observe(time.monotonic() - started)

    def _tick(self, group: Group) -> float:
        """The evaluation time of this run of ``group``: its schedule's grid point, as
        Prometheus does, so that `for: 5s` on a 5 s interval holds after exactly one interval
        however late the scheduler's thread woke up."""
        now = self.clock()
        epoch = self._epochs.get(group.name)
        if epoch is None:
            return now
        return epoch + round((now - epoch) / group.interval_s) * group.interval_s

    def evaluate_policy(self, policy: Policy, now: float | None = None) -> list[Decision]:
        now = self.clock() if now is None else now
        self.metrics.evaluations.labels(policy.group, policy.name).inc()
        with self._policy_lock(policy.name):  # one writer of this policy's state at a time
            state = self.store.policy_state(policy.name)
            result = self._query(policy, now, has_firing=bool(state.firing()))
            step = evaluate(policy, result, state, now, self._freshness(policy))
            if step.skipped is not None:
                self._skipped(step.skipped)
            population = self._population(policy, now, step.decisions) if step.decisions else None
            return self._decide(policy, step.decisions, step.state, now, population)

    def _freshness(self, policy: Policy) -> Freshness:  # issue 10: fresh data only
        group = next((g for g in self.rules.groups if g.name == policy.group), None)
        if group is None:
            return self.config.prometheus.freshness(math.inf)
        return self.config.prometheus.freshness(group.interval_s, group.max_sample_age_s)

    def _policy_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._policy_locks.setdefault(name, threading.Lock())

    def _query(self, policy: Policy, now: float, has_firing: bool) -> QueryResult:
        assert policy.expr is not None
        try:
            samples = self.prometheus.query(policy.expr, at=now)
            clear = None
            if policy.clear_expr is not None and has_firing:
                clear = self.prometheus.query(policy.clear_expr, at=now)
            inputs = [policy.expr, policy.clear_expr or ""] if clear is not None else [policy.expr]
            age = self.prometheus.sample_age(inputs, at=now)  # issue 10: fresh data only
        except QueryError as exc:
            self.metrics.query_failures.labels(policy.name).inc()
            return QueryResult(error=str(exc))
        return QueryResult(samples, clear, sample_age=age)

    def _population(
        self, policy: Policy, now: float, decisions: Iterable[Decision] = ()
    ) -> int | None:
        expr = population_expr(policy, {n for d in decisions for n in d.target.labels})
        if expr is None:
            # max_fraction of targets without labels (`sum(x) > 10`): there is only one
            return 1 if policy.max_fraction is not None else None
        try:
            return len(self.prometheus.query(expr, at=now))
        except QueryError as exc:
            log.warning("population of %s unknown: %s", policy.name, exc)
            return None

    def _skipped(self, skipped: SkippedEvaluation) -> None:
        log.warning(
            "skipped %s: %s (no state changed, nothing acted on)", skipped.policy, skipped.error
        )
        self.audit.skipped(skipped)

    def _decide(
        self,
        policy: Policy,
        decisions: tuple[Decision, ...],
        next_state: PolicyState | None,
        now: float,
        population: int | None,
    ) -> list[Decision]:
        to_run: list[Decision] = []
        with self._lock:
            gstate = self.store.guardrail_state()
            ctx = Context(
                kill_switch=self.kill_switch_on(),
                paused=self.paused(),
                engine_dry_run=self.config.guardrails.dry_run,
                global_max_per_hour=self.config.guardrails.global_max_per_hour,
                population=population,
            )
            judged, gstate = judge_all(decisions, policy, gstate, ctx, now)
            if next_state is not None:
                retry = partial(retry_time, policy=policy, state=gstate, now=now)
                next_state = settle(next_state, judged, retry)
            with self.store.transaction() as db:
                if next_state is not None:
                    self.store.save_policy_state(db, policy.name, next_state)
                self.store.save_guardrail_state(db, gstate)
                for decision in judged:
                    runs = decision.verdict == Verdict.EXECUTE.value and decision.action is not None
                    doc = decision_doc(decision)
                    fresh = self.store.record_decision(db, doc, "started" if runs else "done")
                    if runs and fresh:
                        to_run.append(decision)
                    if fresh and decision.verdict == Verdict.AWAITING_APPROVAL.value:
                        ttl = self.config.guardrails.approval_ttl
                        self.store.save_approval(db, doc, now, now + ttl)
        for decision in judged:
            if decision.transition is not Transition.FIRE:
                self._cancel_approvals(decision, now)
            self.metrics.decisions.labels(
                decision.policy, decision.transition.value, decision.verdict
            ).inc()
            if decision in to_run:
                self._submit(decision)
            else:
                self._record(decision, None)
        return judged

    # --- Alertmanager triggers -----------------------------------------------------------------
    def handle_alert(self, alert: Mapping[str, Any]) -> list[Decision]:
        """Decide on one Alertmanager alert (webhook v4 ``alerts[]`` item): a firing alert runs
        the ``action`` of every policy whose ``trigger.alertmanager`` labels it carries, a
        resolved one their ``on_clear``. Ids come from (policy, target, startsAt), so a retried
        webhook never acts twice."""
        now = self.clock()
        labels = {str(k): str(v) for k, v in dict(alert.get("labels", {})).items()}
        firing = alert.get("status", "firing") == "firing"
        episode = _epoch(str(alert.get("startsAt", ""))) or now
        judged: list[Decision] = []
        for policy in self.rules.policies():
            decision = evaluate_alert(policy, labels, firing, episode, now)
            if decision is not None and not firing:
                decision = self._undo_only_what_ran(decision)
            if decision is not None:
                population = self._population(policy, now, (decision,))
                judged += self._decide(policy, (decision,), None, now, population)
        return judged

    def _undo_only_what_ran(self, resolve: Decision) -> Decision:
        """A resolved alert runs on_clear only if its firing alert's action ran and succeeded."""
        fire_id = decision_id(resolve.policy, resolve.target.key, resolve.episode_start, "fire")
        fire = self.store.decision(fire_id)
        outcome = (fire or {}).get("outcome") or {}
        if outcome.get("status") == OutcomeStatus.SUCCESS.value or (
            fire is not None and fire.get("verdict") == "dry_run"
        ):
            return resolve
        return replace(
            resolve,
            action=None,
            reason=f"{resolve.reason}; nothing to undo (the action did not run)",
        )

    # --- actions ---------------------------------------------------------------------------
    def _submit(self, decision: Decision) -> None:
        future = self._pool.submit(self._run, decision)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def execute_action(self, decision: Decision) -> Outcome:
        """Run ``decision``'s action on its executor (created once, with its settings) and
        count it; never raises. The runtime's pool and the API's quota requests use it."""
        assert decision.action is not None
        name = decision.action.executor
        try:
            executor = self._executor(name)
        except (KeyError, ValueError, TypeError) as exc:  # unknown executor, bad settings
            outcome = Outcome(OutcomeStatus.FAILURE, error=f"executor {name!r}: {exc}")
        else:
            outcome = execute(executor, decision)
        self.metrics.actions.labels(name, decision.action.type, outcome.status.value).inc()
        self.metrics.action_duration.labels(name).observe(outcome.duration_s)
        return outcome

    def _run(self, decision: Decision) -> None:
        outcome = self.execute_action(decision)
        self.store.finish_decision(decision.id, outcome_doc(outcome))
        if not outcome.ok:
            self._after_failure(decision)
        self._record(decision, outcome)

    def _after_failure(self, decision: Decision) -> None:
        """A failed action is decided again later while its target stays in the same state,
        and starts no cooldown (it changed nothing); rate limits still count the attempt."""
        with self._policy_lock(decision.policy), self._lock:
            state = self.store.policy_state(decision.policy)
            after = failed(state, decision, self.clock() + RETRY_S)
            guard = forget_action(self.store.guardrail_state(), decision)
            with self.store.transaction() as db:
                self.store.save_policy_state(db, decision.policy, after)
                self.store.save_guardrail_state(db, guard)

    def _executor(self, name: str) -> Executor:
        with self._lock:
            if name not in self._executors:
                self._executors[name] = self.registry.create(name, self.config.executors.get(name))
            return self._executors[name]

    def _record(self, decision: Decision, outcome: Outcome | None) -> None:
        try:
            self.audit.decision(decision, outcome)
        finally:
            if self.listener is not None:
                self.listener(decision, outcome)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no action is running (tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            for future in list(self._pending):
                try:
                    future.result(timeout=max(0.0, deadline - time.monotonic()))
                except Exception:  # the action's own failure is already its outcome
                    log.debug("action future ended with an error", exc_info=True)
        return not self._pending

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Load rules (a bad rule set at start is fatal), start audit and the scheduler."""
        self.reload(strict=True)
        self.audit.start()
        self._resume_unfinished()
        self._scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30}
        )
        self._schedule_groups()
        self._scheduler.add_job(
            self.expire_approvals, IntervalTrigger(seconds=30), id="gpuops-approvals-expiry"
        )
        self._scheduler.add_job(
            self.prune, IntervalTrigger(hours=6), id="gpuops-prune", next_run_time=_utcnow()
        )
        self._scheduler.add_job(
            self.check_reload,
            IntervalTrigger(seconds=self.config.reload_check_interval),
            id="gpuops-rules-watch",
        )
        self._scheduler.start()

    def prune(self) -> None:
        """Keep the state file bounded: decisions older than ``DECISION_MEMORY_S`` go (the
        audit trail, not the state file, is the record of the past)."""
        gone = self.store.prune(self.clock() - DECISION_MEMORY_S)
        gone += self.store.prune_alert_episodes(self.clock() - DECISION_MEMORY_S)
        if gone:
            log.info("pruned %d old decisions and approvals from the state file", gone)

    def _resume_unfinished(self) -> None:
        """Run again the actions a crash interrupted (recorded ``started``, never finished):
        executors are idempotent by decision id, so one that did run has no second effect."""
        for doc in self.store.unfinished():
            decision = decision_from_doc(doc)
            log.warning(
                "resuming action %s of %s interrupted by a restart", decision.id, decision.policy
            )
            self._submit(decision)

    def _schedule_groups(self) -> None:
        assert self._scheduler is not None
        wanted: set[str] = set()
        for group in self.rules.groups:
            job_id = f"group:{group.name}"
            wanted.add(job_id)
            self._epochs[group.name] = self.clock()
            self._scheduler.add_job(
                self.evaluate_group,
                IntervalTrigger(seconds=group.interval_s),
                args=[group],
                id=job_id,
                replace_existing=True,
                next_run_time=_utcnow(),
            )
            for policy in group.policies:
                if policy.schedule is None or policy.expr is None:
                    continue
                job_id = f"schedule:{policy.name}"
                wanted.add(job_id)
                one = replace(group, policies=(policy,))
                self._scheduler.add_job(
                    self.evaluate_group,
                    CronTrigger.from_crontab(policy.schedule),
                    args=[one, True],
                    id=job_id,
                    replace_existing=True,
                )
        for job in self._scheduler.get_jobs():
            if job.id.startswith(("group:", "schedule:")) and job.id not in wanted:
                job.remove()

    def stop(self) -> None:
        """Stop scheduling, let running actions finish, close audit and state (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        self.wait_idle()
        self._pool.shutdown(wait=True)
        self.audit.close()
        self.store.close()


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _epoch(rfc3339: str) -> float | None:
    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
