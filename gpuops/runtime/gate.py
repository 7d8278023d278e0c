"""The gate: the one component that calls executors.

Every action — policy fire, clear and repeat, granted approval, quota grant and its end,
Alertmanager-triggered, resumed after a crash, retried after a failure — reaches an executor
only through ``Gate.admit``. The gate:

1. writes the intent (decision + verdict) of every decision it is handed to the audit spool,
   fsync'd, in one write, *before* any of them runs (write-ahead); when the spool cannot take it
   (disk full, unwritable) nothing runs, ``problem`` says why (``/healthz`` turns red), a metric
   counts it, and ``reconcile`` writes it and runs the actions once the spool is writable again;
2. checks again at the moment of execution, in the worker: kill switch, pause, engine and
   policy dry-run, the global budget — an action held there is audited with its reason like any
   suppression and decided again later;
3. runs the action on the workers of its executor's lane (``gpuops.actions.base.lane``: the
   webhook's receiver; bounded concurrency per lane, a bounded number of lanes: one slow
   receiver cannot starve the others) through ``gpuops.actions.base.execute``;
4. stores and audits the outcome, and feeds a failure back into the policy's state: a permanent
   failure is not retried within the episode, a temporary one is decided again after an
   exponential backoff with a cap.

At start, ``resume`` writes what the state file holds and the spool lacks (reconciliation) and
runs again the actions a crash interrupted (executors are idempotent by decision id). Built by
``gpuops.runtime.facade.Engine``; the cycle, approvals, quota and the alert inbox hand it work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from gpuops.actions.base import Executor, ExecutorRegistry, RetryPolicy, execute, lane
from gpuops.audit import AuditLog, AuditWriteError
from gpuops.model.decisions import (
    Decision,
    Outcome,
    OutcomeStatus,
    Suppression,
    Transition,
    Verdict,
    freeze,
)
from gpuops.model.evaluation import PolicyState, Status, failed
from gpuops.model.guardrails import (
    RETRY_S,
    Context,
    GuardrailState,
    Windows,
    budget_retry_time,
    forget_action,
    forget_execution,
    recheck,
    retry_time,
    summarize,
)
from gpuops.model.rules.model import Policy
from gpuops.runtime.controls import Controls, Locks
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from gpuops.store.errors import StateError
from gpuops.store.interface import Audited, DecisionStatus, Store, StoredDecision

log = logging.getLogger(__name__)

DecisionListener = Callable[[Decision, Outcome | None], None]
OutcomeHook = Callable[[Decision, Outcome], None]

MAX_RETRY_S = 3600.0
"""The cap of the backoff between tries of a temporarily failing action (60 s, doubled per
failure of the episode, at most an hour)."""


@dataclass(frozen=True)
class _Hold:
    """Why the gate holds an action: its verdict and reason; when its target is decided again
    (``retry_at``; None with ``keep_state``: the policy's state is left as it is)."""

    verdict: Verdict
    why: str
    retry_at: float | None = None
    keep_state: bool = False


NOT_LEADING = "not the leader any more"
"""The error of an action this replica did not run, or stopped trying, because it lost its
lease (``gpuops.runtime.leadership``): nothing is stored, the new leader resumes it."""

WINDOWS_S = 5.0
"""How long the gate reuses its count of unchanged guardrail windows (an execution that left the
hour's window meanwhile still counts for at most this long: it holds, never lets through)."""


class _OutcomeBatch:
    """Group commit of outcomes' audit: a worker whose outcome is stored hands it here and
    waits until it is written; the first waiting worker writes every outcome handed in until
    then (one spool write, one transaction), the others wait for it (the spool's own group
    commit, one level up). A failure of the write is raised in every worker of its batch."""

    def __init__(self, write: Callable[[Sequence[tuple[Decision, Outcome]]], None]) -> None:
        self._write = write
        self._cv = threading.Condition()
        self._pending: list[tuple[Decision, Outcome]] = []
        self._queued = 0  # outcomes handed in (tickets)
        self._done = 0  # outcomes written (or failed)
        self._writing = False
        self._failures: list[tuple[int, int, BaseException]] = []

    def write(self, decision: Decision, outcome: Outcome) -> None:
        with self._cv:
            self._pending.append((decision, outcome))
            self._queued += 1
            ticket = self._queued
            while self._done < ticket:
                if self._writing:
                    self._cv.wait()
                    continue
                self._writing = True
                batch, self._pending = self._pending, []
                low, high = self._done, self._queued
                self._cv.release()
                failure: BaseException | None = None
                try:
                    self._write(batch)
                except BaseException as exc:  # raised below in each worker of the batch
                    failure = exc
                finally:
                    self._cv.acquire()
                    self._writing = False
                    self._done = high
                    if failure is not None:
                        self._failures.append((low, high, failure))
                        del self._failures[:-64]  # older batches have no waiter left
                    self._cv.notify_all()
            for low, high, failure in self._failures:
                if low < ticket <= high:
                    raise failure


LANES_PER_EXECUTOR = 16
"""Lanes with workers of their own per executor (webhook: receivers). Enough for the receivers
a team runs; a host templated from labels (one lane per node) cannot make threads without end."""

_Pool = tuple[str, str]
"""A pool's key: executor name and lane (``""``: the executor's shared pool)."""


class _Lanes:
    """The gate's worker pools, one per (executor, lane), ``workers`` threads each. An executor
    has at most ``cap`` lanes of its own at a time: a new lane takes the place of one with
    nothing queued or running (its threads end); while all ``cap`` are busy, the actions of a
    new lane run on the executor's shared pool (lane ``""``, also the one pool of an executor
    that names no lanes). So an executor has at most ``(cap + 1) * workers`` threads, whatever
    label values name lanes. Not locked itself: the gate calls it holding its lock."""

    def __init__(self, workers: int, cap: int) -> None:
        self._workers = workers
        self._cap = cap
        self._pools: dict[_Pool, ThreadPoolExecutor] = {}
        self._load: dict[_Pool, int] = {}  # actions queued or running, per pool
        self._shared: set[str] = set()  # executors whose new lanes now run on their "" pool
        self._made = 0

    def take(self, executor: str, lane: str) -> tuple[_Pool, ThreadPoolExecutor]:
        """The pool an action of ``lane`` on ``executor`` runs on, busy until ``release``."""
        key = self._place(executor, lane)
        pool = self._pools.get(key)
        if pool is None:
            self._made += 1
            pool = ThreadPoolExecutor(
                self._workers, thread_name_prefix=f"gpuops-{executor}-{self._made}"
            )
            self._pools[key] = pool
        self._load[key] = self._load.get(key, 0) + 1
        return key, pool

    def release(self, key: _Pool) -> None:
        self._load[key] -= 1

    def _place(self, executor: str, lane: str) -> _Pool:
        key = (executor, lane)
        if not lane or key in self._pools:
            return key
        own = [k for k in self._pools if k[0] == executor and k[1]]
        if len(own) >= self._cap:
            idle = next((k for k in own if not self._load.get(k)), None)
            if idle is None:
                if executor not in self._shared:
                    self._shared.add(executor)
                    log.warning(
                        "executor %s: all %d lanes busy; new lanes share %d workers until one "
                        "is idle",
                        executor,
                        self._cap,
                        self._workers,
                    )
                return (executor, "")
            self._pools.pop(idle).shutdown(wait=False)
            del self._load[idle]
        self._shared.discard(executor)
        return key

    def pools(self) -> list[ThreadPoolExecutor]:
        return list(self._pools.values())


class RetryError(Exception):
    """An action that cannot be retried now (it did not fail, or its target moved on)."""


class Gate:
    """The only caller of executors; see the module docstring for what it guarantees."""

    def __init__(
        self,
        *,
        settings: GuardrailSettings,
        executor_settings: Mapping[str, Mapping[str, Any]],
        store: Store,
        audit: AuditLog,
        registry: ExecutorRegistry,
        metrics: EngineMetrics,
        controls: Controls,
        locks: Locks,
        clock: Callable[[], float],
        policy: Callable[[str], Policy | None],
        population: Callable[[Policy, Decision], int | None] = lambda policy, decision: None,
        listener: DecisionListener | None = None,
        workers_per_executor: int = 4,
        lanes_per_executor: int = LANES_PER_EXECUTOR,
        retry: RetryPolicy | None = None,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """``leading``: whether this replica still leads (``gpuops.runtime.leadership``),
        asked just before each executor call: a replica that lost its lease runs nothing and
        leaves the decision ``started`` for the new leader to resume. ``workers_per_executor``:
        concurrent actions per lane of an executor (``_Lanes``), at most
        ``lanes_per_executor`` lanes of its own per executor."""
        self._leading = leading
        self._settings = settings
        self._executor_settings = executor_settings
        self._store = store
        self._audit = audit
        self._registry = registry
        self._metrics = metrics
        self._controls = controls
        self._locks = locks
        self._clock = clock
        self._policy = policy
        self._population = population
        self._memo: tuple[GuardrailState, Windows] | None = None
        self._listener = listener
        self._retry = retry or RetryPolicy()
        self._hooks: list[OutcomeHook] = []
        self._admit_lock = threading.Lock()  # intent writes and reconciliation, one at a time
        self._lock = threading.Lock()  # executors, pools, in-flight
        self._executors: dict[str, Executor] = {}
        self._lanes = _Lanes(workers_per_executor, lanes_per_executor)
        self._in_flight: dict[str, Future[Outcome]] = {}
        self._running: set[str] = set()  # ids submitted and not done (set before submitting)
        self._problem: str | None = None
        self._outcomes = _OutcomeBatch(self._write_outcomes)
        self._resume_pending = False
        self._stopped = False
        metrics.audit_healthy.set(1)

    # --- health ----------------------------------------------------------------------------
    @property
    def problem(self) -> str | None:
        """Why no action can run now (the audit spool is not writable), or None."""
        return self._problem

    def _failed_write(self, what: str, exc: AuditWriteError, count: int) -> None:
        self._metrics.audit_write_failures.labels(what).inc(count)
        self._metrics.audit_healthy.set(0)
        reason = f"{what} not written to the audit: {exc}"
        if self._problem is None:
            log.error("%s; no action runs until the spool is writable again", reason)
        self._problem = reason

    def _wrote(self) -> None:
        if self._problem is not None:
            log.warning("the audit spool is writable again: actions resume")
        self._problem = None
        self._metrics.audit_healthy.set(1)

    def on_outcome(self, hook: OutcomeHook) -> None:
        """Call ``hook`` after every action's outcome is stored (the alert inbox's early
        resolves, the quota flow)."""
        self._hooks.append(hook)

    # --- admission -------------------------------------------------------------------------
    def admit(
        self, decisions: Sequence[Decision], runs: Collection[str]
    ) -> dict[str, Future[Outcome]]:
        """Audit the intent of ``decisions`` (recorded in the state file, ``audited = 0``)
        durably, then run those whose id is in ``runs``. Returns the futures of the actions
        started; none when the intent could not be written (they wait for ``reconcile``)."""
        if not decisions:
            return {}
        with self._admit_lock:
            try:
                return self._admit(decisions, runs)
            except StateError as exc:  # stored as started, the intent maybe not marked
                reason = f"decisions not admitted: {exc}"
                log.error("%s; they run after ``reconcile`` writes what is missing", reason)
                self._problem = reason  # so that ``reconcile`` runs (gpuops.runtime.facade)
                return {}

    def _admit(
        self, decisions: Sequence[Decision], runs: Collection[str]
    ) -> dict[str, Future[Outcome]]:
        """``admit``'s work (holding ``_admit_lock``)."""
        waiting = self._store.unaudited_ids([d.id for d in decisions])
        fresh = [d for d in decisions if d.id in waiting]
        if not fresh:
            return {}
        try:
            self._audit.write_ahead([(d, None) for d in fresh])
        except AuditWriteError as exc:
            self._failed_write("intent", exc, len(fresh))
            held = sum(1 for d in fresh if d.id in runs)
            self._metrics.held.labels("audit_unwritable").inc(held)
            return {}
        self._store.mark_audited([d.id for d in fresh], Audited.INTENT)
        self._wrote()
        futures = {}
        for decision in fresh:
            if decision.id in runs:
                future = self._submit(decision)
                if future is not None:
                    futures[decision.id] = future
            else:
                self._notify(decision, None)
        return futures

    def reconcile(self, run_started: bool = True) -> int:
        """Write what the state file holds and the spool lacks: intents (and, with
        ``run_started``, then run those actions) and outcomes. Returns the documents written;
        on a still unwritable spool, 0 and ``problem`` stays."""
        with self._admit_lock:
            rows = self._store.unaudited()
            lacking = self._outcomes_lacking(rows)
            entries: list[tuple[Decision, Outcome | None]] = []
            intents, outcomes, to_run = [], [], []
            for stored in rows:
                decision = stored.decision
                if stored.audited < Audited.INTENT:
                    entries.append((decision, None))
                    intents.append(decision.id)
                    if stored.status is DecisionStatus.STARTED:
                        to_run.append(decision)
                if stored.outcome is not None and decision.id in lacking:
                    entries.append((decision, stored.outcome))
                    outcomes.append(decision.id)
            if not entries:  # nothing waits for the spool (the next write tells if it is full)
                if self._problem is not None:
                    self._wrote()
                if self._resume_pending:
                    self._resume_pending = False
                    self._resume_unfinished()
                return 0
            try:
                self._audit.write_ahead(entries)
            except AuditWriteError as exc:
                self._failed_write("reconciliation", exc, len(entries))
                return 0
            self._store.mark_audited(intents, Audited.INTENT)
            self._store.mark_audited(outcomes, Audited.OUTCOME)
            self._wrote()
            log.warning(
                "audit reconciled: %d intents and %d outcomes the spool lacked written",
                len(intents),
                len(outcomes),
            )
            if self._resume_pending:
                self._resume_pending = False
                self._resume_unfinished()
            elif run_started:
                for decision in to_run:
                    self._submit(decision)
            return len(entries)

    def _outcomes_lacking(self, rows: Sequence[StoredDecision]) -> set[str]:
        """The ids among ``rows`` (just read) whose stored outcome the spool lacks and no worker
        of this gate is about to write: an action still in ``_run`` (its outcome waiting in
        the outcome batch) writes and marks its own, so reconciliation writing it too would
        leave two copies in the spool. Its worker marks the outcome audited before it leaves
        ``_running``, so what is not running now is read again: written and marked meanwhile,
        or lacking for good (a failed write or mark, a previous run's)."""
        with self._lock:
            running = set(self._running)  # after the rows were read: see the docstring
        idle = [s.id for s in rows if s.outcome is not None and s.id not in running]
        if not idle:
            return set()
        return {s.id for s in self._store.unaudited(idle) if s.outcome is not None}

    def resume(self) -> None:
        """At start: reconcile the audit with the state file, then run again the actions a
        crash interrupted (recorded ``started``, never finished)."""
        self.reconcile(run_started=False)
        if self._problem is not None:
            self._resume_pending = True  # ``reconcile`` resumes them once the spool is writable
            return
        self._resume_unfinished()

    def _resume_unfinished(self) -> None:
        for stored in self._store.unfinished():
            decision = stored.decision
            log.warning(
                "resuming action %s of %s interrupted by a restart", decision.id, decision.policy
            )
            self._submit(decision)

    # --- running ---------------------------------------------------------------------------
    def _submit(self, decision: Decision) -> Future[Outcome] | None:
        assert decision.action is not None
        name = decision.action.executor
        try:
            where = lane(self._executor(name), decision)
        except Exception:  # not built (unknown, bad settings): ``_execute`` says so as the outcome
            log.debug("executor %s not built: %s runs in its shared lane", name, decision.id)
            where = ""
        with self._lock:
            if self._stopped:
                return None
            known = self._in_flight.get(decision.id)
            if known is not None:  # one id runs once at a time
                return known
            key, pool = self._lanes.take(name, where)
            self._running.add(decision.id)  # before it can start: see _outcomes_lacking
            future = pool.submit(self._run, decision)
            self._in_flight[decision.id] = future
        future.add_done_callback(lambda _: self._done(decision.id, key))
        return future

    def _done(self, decision_id: str, key: _Pool) -> None:
        with self._lock:
            self._in_flight.pop(decision_id, None)
            self._running.discard(decision_id)
            self._lanes.release(key)

    def _not_leading(self, decision: Decision) -> Outcome | None:
        """The outcome of an action this replica may not run or go on with because it no longer
        leads (nothing stored: the decision stays started for the leader to resume), or None."""
        if self._leading():
            return None
        log.warning(
            "action %s of %s not run: this replica no longer leads (the leader resumes it)",
            decision.id,
            decision.policy,
        )
        return Outcome(OutcomeStatus.SKIPPED, error=NOT_LEADING)

    def _run(self, decision: Decision) -> Outcome:
        not_leading = self._not_leading(decision)
        if not_leading is not None:
            return not_leading
        stored = self._store.decision(decision.id)
        if (
            stored is None
            or stored.status is not DecisionStatus.STARTED
            or stored.audited < Audited.INTENT
        ):
            # never twice, never before its intent is audited: another path (admission,
            # reconciliation, resume) ran it or will, after writing its intent
            log.debug("decision %s is not runnable now: nothing started", decision.id)
            if stored is not None and stored.outcome is not None:
                return stored.outcome
            return Outcome(OutcomeStatus.SKIPPED, error="not runnable: run by another path")
        held = self._held(decision)
        not_leading = self._not_leading(decision)  # asked again: ``_held`` may have waited
        if not_leading is not None:
            return not_leading
        if held is not None:
            outcome = self._hold(decision, held)
        else:
            outcome = self._execute(decision)
            if outcome.status is OutcomeStatus.SKIPPED and outcome.error == NOT_LEADING:
                return outcome  # lost the lease between tries: the leader resumes it
            if (
                outcome.status is OutcomeStatus.SKIPPED
            ):  # the kill switch or pause came between tries
                outcome = self._hold(
                    decision,
                    self._controlled()
                    or _Hold(Suppression.KILL_SWITCH.verdict, outcome.error or ""),
                )
            else:
                try:
                    self._store.finish_decision(decision.id, outcome)
                except StateError:
                    # not stored (the lease lost, the database gone): the action ran, so its
                    # outcome is audited all the same; the decision stays started
                    self.record(decision, outcome)
                    raise
                if not outcome.ok:
                    self._after_failure(decision, outcome)
                self._write_outcome(decision, outcome)
        for hook in self._hooks:
            try:
                hook(decision, outcome)
            except Exception:  # a collaborator's bug must not lose the outcome
                log.exception("outcome hook failed for decision %s", decision.id)
        return outcome

    def _controlled(self) -> _Hold | None:
        """The kill switch or pause, when on (asked again between an action's tries)."""
        if self._controls.kill_switch_on():
            return _Hold(Suppression.KILL_SWITCH.verdict, "the kill switch is on: no action runs")
        if self._controls.paused():
            return _Hold(Suppression.PAUSED.verdict, "the engine is paused")
        return None

    def _interrupted(self) -> str | None:
        """Why an action may not try again (asked between its tries), or None."""
        controlled = self._controlled()
        if controlled is not None:
            return controlled.why
        return None if self._leading() else NOT_LEADING

    def _held(self, decision: Decision) -> _Hold | None:
        """What holds ``decision`` at the moment of execution, or None: the kill switch, pause,
        its policy removed from the rule set, its age, engine and policy dry-run, then the
        policy's guardrails as they stand now (cooldown, max_per_hour, max_fraction) and the
        global budget (``gpuops.model.guardrails.recheck``)."""
        controlled = self._controlled()
        if controlled is not None:
            return controlled
        now = self._clock()
        policy = self._policy(decision.policy)
        if policy is None:
            return _Hold(
                Suppression.POLICY_REMOVED.verdict,
                f"policy {decision.policy!r} is not in the rule set now: decided again"
                " when it is loaded again",
                retry_at=now,
            )
        age = now - decision.at
        if age > self._settings.action_max_age:
            age = now - self._decided_at(decision)
        if age > self._settings.action_max_age:
            return _Hold(
                Suppression.EXPIRED.verdict,
                f"decided {age:.0f}s ago, more than action_max_age"
                f" {self._settings.action_max_age:.0f}s: decided again on fresh data",
                retry_at=now,
            )
        if self._settings.dry_run:
            return _Hold(Verdict.DRY_RUN, "engine is in dry-run", keep_state=True)
        if policy.mode == "dry-run":
            return _Hold(Verdict.DRY_RUN, "policy mode is dry-run", keep_state=True)
        if decision.transition is not Transition.FIRE:
            return None  # an undo passes the policy's limits (gpuops.model.guardrails)
        population = None
        if policy.max_fraction is not None:
            population = self._population(policy, decision)  # a query: before the lock
        with self._locks.engine:
            guard = self._store.guardrail_state()
            windows = self._windows(guard, now)
            budget = self._settings.global_max_per_hour
            ctx = Context(global_max_per_hour=budget, population=population)
            found = recheck(decision, policy, windows, ctx, now)
        if found is None:
            return None
        reason, why = found
        retry_at = retry_time(decision.with_verdict(reason.verdict, why), policy, guard, now)
        if reason is Suppression.GLOBAL_BUDGET and budget is not None:  # when it can allow it
            retry_at = budget_retry_time(guard, budget, now)
        return _Hold(reason.verdict, why, retry_at=retry_at)

    def _windows(self, guard: GuardrailState, now: float) -> Windows:
        """``guard`` counted once while it is the same value (the store returns one value until
        a commit changes it) and at most ``WINDOWS_S`` old (call with the engine lock held)."""
        memo = self._memo
        if memo is None or memo[0] is not guard or now - memo[1].at >= WINDOWS_S:
            memo = (guard, summarize(guard, now))
            self._memo = memo
        return memo[1]

    def _decided_at(self, decision: Decision) -> float:
        """When ``decision`` was decided to run: its time, or its grant's (an approval)."""
        approval = self._store.approval(decision.id)
        if approval is not None and approval.decided_at is not None:
            return max(decision.at, approval.decided_at)
        return decision.at

    def _hold(self, decision: Decision, hold: _Hold) -> Outcome:
        held = decision.with_verdict(hold.verdict, f"held at the gate: {hold.why}")
        outcome = Outcome(OutcomeStatus.SKIPPED, error=held.reason)
        reason = hold.verdict.suppression
        self._metrics.held.labels(reason.value if reason is not None else hold.verdict.value).inc()
        log.warning("action %s of %s %s", decision.id, decision.policy, held.reason)
        self._store.finish_decision(decision.id, outcome, held)
        retry_at = hold.retry_at
        if retry_at is None and not hold.keep_state:
            retry_at = self._clock() + RETRY_S
        self._feed_back(
            decision, retry_at, keep_state=hold.keep_state, held=True, verdict=hold.verdict
        )
        self._metrics.decisions.labels(held.policy, held.transition.value, held.verdict.value).inc()
        self._write_outcome(held, outcome)
        return outcome

    def _execute(self, decision: Decision) -> Outcome:
        assert decision.action is not None
        name = decision.action.executor
        try:
            executor = self._executor(name)
        except (KeyError, ValueError, TypeError) as exc:  # unknown executor, bad settings
            outcome = Outcome(
                OutcomeStatus.FAILURE, error=f"executor {name!r}: {exc}", permanent=True
            )
        else:
            outcome = execute(
                executor,
                decision,
                self._retry,
                interrupted=self._interrupted,
            )
        self._metrics.actions.labels(name, decision.action.type, outcome.status.value).inc()
        self._metrics.action_duration.labels(name).observe(outcome.duration_s)
        return outcome

    def _executor(self, name: str) -> Executor:
        with self._lock:
            if name not in self._executors:
                settings = self._executor_settings.get(name)
                self._executors[name] = self._registry.create(name, settings)
            return self._executors[name]

    def _after_failure(self, decision: Decision, outcome: Outcome) -> None:
        """A permanent failure is not decided again within the episode; a temporary one after
        ``RETRY_S`` doubled per failure of the episode (at most ``MAX_RETRY_S``). Neither
        starts a cooldown (nothing changed); rate limits still count the attempt."""
        if outcome.permanent:
            self._metrics.permanent_failures.labels(decision.policy).inc()
            log.warning(
                "%s on %s failed permanently: not retried in this episode (%s)",
                decision.policy,
                decision.target.key,
                outcome.error,
            )
            self._feed_back(decision, None)
            return
        failures = self._store.failures_in_episode(
            decision.policy, decision.target.key, decision.episode_start
        )
        delay = min(RETRY_S * 2 ** max(0, failures - 1), MAX_RETRY_S)
        log.info(
            "%s on %s failed (%d in this episode): decided again in %.0f s",
            decision.policy,
            decision.target.key,
            failures,
            delay,
        )
        self._feed_back(decision, self._clock() + delay)

    def _feed_back(
        self,
        decision: Decision,
        retry_at: float | None,
        keep_state: bool = False,
        held: bool = False,
        verdict: Verdict | None = None,
    ) -> None:
        """The action did not change anything: no cooldown (``held``: it was not even tried,
        so it leaves the rate windows too); unless ``keep_state``, the policy's state forgets it
        acted (``retry_at``: when it is decided again; None: not in the episode). ``verdict``:
        what held it, recorded on the target (a fire of a policy not loaded: how long it has
        waited for its policy, ``gpuops.runtime.facade``)."""
        with self._locks.policy(decision.policy), self._locks.engine:
            guard = self._store.guardrail_state()
            guard = forget_execution(guard, decision) if held else forget_action(guard, decision)
            state = None
            if not keep_state and decision.policy in self._store.policy_names():
                state = failed(
                    self._store.policy_state(decision.policy), decision, retry_at, verdict
                )
            with self._store.transaction() as db:
                if state is not None:
                    self._store.save_policy_state(db, decision.policy, state)
                self._store.save_guardrail_state(db, guard)

    def retry(self, decision_id: str) -> Decision:
        """An admin's retry of a failed action (a permanent failure is otherwise not retried
        within its episode): its target is decided again at the next evaluation — a new
        decision, judged and run through this gate like any other."""
        stored = self._store.decision(decision_id)
        if stored is None:
            raise LookupError(f"no decision {decision_id}")
        if not stored.failed:
            raise RetryError(f"decision {decision_id} did not fail: nothing to retry")
        decision = stored.decision
        now = self._clock()
        with self._locks.policy(decision.policy), self._locks.engine:
            state = self._store.policy_state(decision.policy)
            current = state.targets.get(decision.target.key)
            if decision.transition is Transition.FIRE:
                if current is None or current.status is not Status.FIRING:
                    raise RetryError(
                        f"the target {decision.target.key} no longer fires: its next episode acts"
                    )
                targets = dict(state.targets)
                targets[decision.target.key] = replace(current, retry_at=now)
                after = PolicyState(freeze(targets))
            elif current is None:
                after = failed(state, decision, now)  # the undo is tried again
            else:
                raise RetryError(f"the target {decision.target.key} fires again: no undo to retry")
            if not self._store.mark_retried(decision_id, now):
                raise RetryError(
                    f"decision {decision_id} was retried already: a failed decision is retried"
                    " once (its retry is a decision of its own, which can be retried if it fails)"
                )
            with self._store.transaction() as db:
                self._store.save_policy_state(db, decision.policy, after)
        log.warning("retry of %s on %s requested", decision.policy, decision.target.key)
        return decision

    def _write_outcome(self, decision: Decision, outcome: Outcome) -> None:
        """Audit a stored outcome; returns once it is written (or failed to be). Outcomes
        that finish together share one spool write and one transaction (``_OutcomeBatch``)."""
        self._outcomes.write(decision, outcome)

    def _write_outcomes(self, batch: Sequence[tuple[Decision, Outcome]]) -> None:
        """One spool write, then one transaction marking them audited, for ``batch``; then
        the listener for each. What fails for the batch (an unwritable spool, a failed mark) is
        logged, and a listener's error for one outcome too, so that no worker of the batch
        skips its outcome hooks for what happened to another (reconciliation writes what the
        spool or the marks lack)."""
        try:
            self._audit.write_ahead(batch)
        except AuditWriteError as exc:
            self._failed_write("outcome", exc, len(batch))  # stored: ``reconcile`` writes them
        else:
            try:
                self._store.mark_audited([d.id for d, _ in batch], Audited.OUTCOME)
            except StateError as exc:  # the spool holds them; reconciliation writes them again
                log.error(  # (the same event ids: the index keeps one copy)
                    "the outcomes of %d actions are in the audit spool but could not be "
                    "marked so: %s",
                    len(batch),
                    exc,
                )
        for decision, outcome in batch:  # each worker's own: one listener error is not theirs
            try:
                self._notify(decision, outcome)
            except Exception:  # a collaborator's bug must not skip the others' outcome hooks
                log.exception("decision listener failed for the outcome of %s", decision.id)

    def _notify(self, decision: Decision, outcome: Outcome | None) -> None:
        if self._listener is not None:
            self._listener(decision, outcome)

    def record(self, decision: Decision, outcome: Outcome | None = None) -> None:
        """Audit a decision that runs nothing (a cancelled, denied or expired approval)."""
        try:
            self._audit.write_ahead([(decision, outcome)])
        except AuditWriteError as exc:
            self._failed_write("decision", exc, 1)
        self._notify(decision, outcome)

    # --- lifecycle -------------------------------------------------------------------------
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no action is running (tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                futures = list(self._in_flight.values())
            if not futures:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for future in futures:
                try:
                    future.result(timeout=max(0.0, deadline - time.monotonic()))
                except Exception:  # the action's own failure is already its outcome
                    log.debug("action future ended with an error", exc_info=True)
                    if time.monotonic() >= deadline:
                        break

    def stop(self, timeout: float = 30.0) -> None:
        """Let running actions finish, start no new one."""
        self.wait_idle(timeout)
        with self._lock:
            self._stopped = True
            pools = self._lanes.pools()
        for pool in pools:
            pool.shutdown(wait=True)
