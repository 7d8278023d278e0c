"""``Gate``: admission, the workers and what runs — the one place an executor is called.

``admit`` writes the intents of the decisions it is handed (``gpuops.runtime.gate.trail``) and
queues those to run on the pool of their executor's lane (``gpuops.runtime.gate.lanes``); each
worker checks the action again (``gpuops.runtime.gate.holds``), runs it through
``gpuops.actions.base.execute``, stores its outcome, feeds a failure or a hold back into the
policy's state (``gpuops.runtime.gate.feedback``) and audits the outcome (batched:
``gpuops.runtime.gate.outcomes``). ``resume`` and ``reconcile`` (``gpuops.runtime.gate.reconcile``)
finish what a crash or an unwritable spool left. The package docstring lists the promises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from gpuops.actions.base import CANCELLED_PREFIX as CANCELLED_PREFIX
from gpuops.actions.base import Cancel, Executor, execute, lane, standing
from gpuops.actions.registry import LOGICAL_DEFAULTS, ExecutorRegistry
from gpuops.actions.retry import RetryPolicy
from gpuops.audit import AuditLog
from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, Suppression, Verdict
from gpuops.model.guardrails import RETRY_S, Standing
from gpuops.model.rules.model import Policy
from gpuops.model.telling import effect
from gpuops.runtime.controls import Controls, Locks
from gpuops.runtime.gate.feedback import Feedback
from gpuops.runtime.gate.holds import Hold, Holds
from gpuops.runtime.gate.lanes import LANES_PER_EXECUTOR, Lanes, PoolKey
from gpuops.runtime.gate.reconcile import Reconciler
from gpuops.runtime.gate.retry import retry
from gpuops.runtime.gate.told import Told
from gpuops.runtime.gate.trail import DecisionListener, Trail
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from gpuops.store.errors import StateError
from gpuops.store.interface import Audited, DecisionStatus, Store

log = logging.getLogger(__name__)

ONCE = RetryPolicy(attempts=1)
"""One try: what a step run with ``once`` gets."""

DRY_RUN_PREFIX = "dry-run: "
"""How the error of a batch step's outcome starts when it ran nothing for dry-run
(``Gate.run_step``)."""

HELD_STEPS_KEPT = 10_000
"""Held steps whose last hold the gate remembers, so as to tell each hold once
(``Gate.run_step``); past it the oldest is forgotten and, if tried again, told again."""

OutcomeHook = Callable[[Decision, Outcome], None]
"""Called after every action's outcome is stored (``Gate.on_outcome``)."""

NOT_LEADING = "not the leader any more"
"""The error of an action this replica did not run, or stopped trying, because it lost its
lease (``gpuops.runtime.leadership``): nothing is stored, the new leader resumes it."""


class ExecutorsRefused(Exception):
    """A configured executor cannot be built from its settings (one line per executor, each
    ``executors.NAME ...: what``): the engine does not start on them."""


class Gate:
    """The only caller of executors; see the package docstring for what it guarantees."""

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
        told: Told | None = None,
    ) -> None:
        """``executor_settings``: each executor's settings as configured (``executors:``),
        handed to the registry, which validates them when it builds the executor.
        ``leading``: whether this replica still leads (``gpuops.runtime.leadership``),
        asked just before each executor call: a replica that lost its lease runs nothing and
        leaves the decision ``started`` for the new leader to resume. ``workers_per_executor``:
        concurrent actions per lane of an executor (``Lanes``), at most ``lanes_per_executor``
        lanes of its own per executor. ``told``: the log lines of decisions and outcomes
        (``gpuops.runtime.gate.told``)."""
        self._leading = leading
        self._executor_settings = executor_settings
        self._store = store
        self._audit = audit
        self._registry = registry
        self._metrics = metrics
        self._locks = locks
        self._clock = clock
        self._retry = retry or RetryPolicy()
        self._trail = Trail(audit, store, metrics, listener, told)
        self.told = self._trail.told
        self._holds = Holds(
            settings=settings,
            store=store,
            controls=controls,
            locks=locks,
            clock=clock,
            policy=policy,
            population=population,
            standing=self._standing,
        )
        self._feedback = Feedback(store=store, locks=locks, metrics=metrics, clock=clock)
        self._reconciler = Reconciler(store, self._trail, self._running_ids)
        self._hooks: list[OutcomeHook] = []
        self._admit_lock = threading.Lock()  # intent writes and reconciliation, one at a time
        self._lock = threading.Lock()  # executors, pools, in-flight
        self._executors: dict[str, Executor] = {}
        self._lanes = Lanes(workers_per_executor, lanes_per_executor)
        self._in_flight: dict[str, Future[Outcome]] = {}
        self._held_steps: dict[str, tuple[Verdict, str]] = {}  # step id -> its last hold told
        self._running: set[str] = set()  # ids submitted and not done (set before submitting)
        self._resume_pending = False
        self._stopped = False

    # --- health ----------------------------------------------------------------------------
    @property
    def problem(self) -> str | None:
        """Why no action can run now (the audit spool is not writable), or None."""
        return self._trail.problem

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
                self._trail.fail(reason)  # so that ``reconcile`` runs (gpuops.runtime.facade)
                return {}

    def _admit(
        self, decisions: Sequence[Decision], runs: Collection[str]
    ) -> dict[str, Future[Outcome]]:
        """``admit``'s work (holding ``_admit_lock``)."""
        waiting = self._store.unaudited_ids([d.id for d in decisions])
        fresh = [d for d in decisions if d.id in waiting]
        if not fresh:
            return {}
        if not self._trail.write_intents(fresh):
            held = sum(1 for d in fresh if d.id in runs)
            self._metrics.held.labels("audit_unwritable").inc(held)
            return {}
        self._store.mark_audited([d.id for d in fresh], Audited.INTENT)
        self._trail.wrote()
        futures = {}
        for decision in fresh:
            if decision.id in runs:
                future = self._submit(decision)
                if future is not None:
                    futures[decision.id] = future
            else:
                self._trail.notify(decision, None)
        return futures

    def reconcile(self, run_started: bool = True) -> int:
        """Write what the state file holds and the spool lacks: intents (and, with
        ``run_started``, then run those actions) and outcomes. Returns the documents written;
        on a still unwritable spool, 0 and ``problem`` stays."""
        with self._admit_lock:
            done = self._reconciler.write_lacking()
            if done is None:
                return 0
            if self._resume_pending:
                self._resume_pending = False
                self._resume_unfinished()
            elif run_started:
                for decision in done.started:
                    self._submit(decision)
            return done.written

    def resume(self) -> None:
        """At start: reconcile the audit with the state file, then run again the actions a
        crash interrupted (recorded ``started``, never finished)."""
        self.reconcile(run_started=False)
        if self.problem is not None:
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
            self._running.add(decision.id)  # before it can start: see ``Reconciler``
            future = pool.submit(self._run, decision)
            self._in_flight[decision.id] = future
        future.add_done_callback(lambda _: self._done(decision.id, key))
        return future

    def _done(self, decision_id: str, key: PoolKey) -> None:
        with self._lock:
            self._in_flight.pop(decision_id, None)
            self._running.discard(decision_id)
            self._lanes.release(key)

    def _running_ids(self) -> set[str]:
        with self._lock:
            return set(self._running)

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
        held = self._holds.check(decision)
        not_leading = self._not_leading(decision)  # asked again: the checks may have waited
        if not_leading is not None:
            return not_leading
        if held is not None:
            outcome = self._hold(decision, held)
        else:
            outcome = self._execute(decision)
            if outcome.status is OutcomeStatus.SKIPPED and outcome.error == NOT_LEADING:
                return outcome  # lost the lease between tries: the leader resumes it
            if outcome.status is OutcomeStatus.SKIPPED:
                # the kill switch or pause came between its tries
                outcome = self._hold(
                    decision,
                    self._holds.controlled()
                    or Hold(Suppression.KILL_SWITCH.verdict, outcome.error or ""),
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
                    self._feedback.failure(decision, outcome)
                self._trail.write_outcome(decision, outcome)
        for hook in self._hooks:
            try:
                hook(decision, outcome)
            except Exception:  # a collaborator's bug must not lose the outcome
                log.exception("outcome hook failed for decision %s", decision.id)
        return outcome

    def _interrupted(self) -> str | None:
        """Why an action may not try again (asked between its tries), or None."""
        controlled = self._holds.controlled()
        if controlled is not None:
            return controlled.why
        return None if self._leading() else NOT_LEADING

    def _hold(self, decision: Decision, hold: Hold) -> Outcome:
        """Store and audit ``decision`` as held (its outcome skipped, its verdict the hold's)
        and feed the hold back into its policy's state."""
        held = decision.with_verdict(hold.verdict, f"held at the gate: {hold.why}")
        outcome = Outcome(OutcomeStatus.SKIPPED, error=held.reason)
        reason = hold.verdict.suppression
        self._metrics.held.labels(reason.value if reason is not None else hold.verdict.value).inc()
        self._store.finish_decision(decision.id, outcome, held)
        retry_at = hold.retry_at
        if retry_at is None and not hold.keep_state:
            retry_at = self._clock() + RETRY_S
        self._feedback.unchanged(
            decision, retry_at, keep_state=hold.keep_state, held=True, verdict=hold.verdict
        )
        self._metrics.decisions.labels(held.policy, held.transition.value, held.verdict.value).inc()
        self._trail.write_outcome(held, outcome)
        return outcome

    def _execute(
        self,
        decision: Decision,
        cancelled: Cancel | None = None,
        retry: RetryPolicy | None = None,
    ) -> Outcome:
        assert decision.action is not None
        name = decision.action.executor
        try:
            executor = self._executor(name)
        except Exception as exc:  # not built: the action fails (stored, audited), never hangs
            if isinstance(exc, (KeyError, ValueError, TypeError)):  # unknown, bad settings
                error = f"executor {name!r}: {exc}"
                log.warning("action %s of %s not run: %s", decision.id, decision.policy, error)
            else:  # what building it hit (an unreadable token file, a bug): said with its type
                error = f"executor {name!r}: {type(exc).__name__}: {exc}"
                log.exception("action %s of %s not run: %s", decision.id, decision.policy, error)
            outcome = Outcome(OutcomeStatus.FAILURE, error=error[:1024], permanent=True)
        else:
            outcome = execute(
                executor,
                decision,
                retry or self._retry,
                interrupted=self._interrupted,
                cancelled=cancelled,
            )
        said = outcome.status.value
        if outcome.ok and not effect(decision.action.type, outcome.changed).did:
            said = "no_effect"  # it ran and changed nothing its verb promises
        self._metrics.actions.labels(name, decision.action.type, said).inc()
        self._metrics.action_duration.labels(name).observe(outcome.duration_s)
        return outcome

    def _standing(self, decision: Decision) -> Standing | None:
        """What the decision's executor reads of its target now (``holds``); None when it
        cannot be built (its run says why) or reads nothing."""
        if decision.action is None:
            return None
        try:
            executor = self._executor(decision.action.executor)
        except Exception:  # not built (unknown, bad settings): ``_execute`` says so
            return None
        return standing(executor, decision)

    def build_executors(self) -> None:
        """Build every executor the configuration names (``executors:``) now, as its first
        action would, running nothing: ``ExecutorsRefused`` names each one whose settings are
        wrong or whose file of secrets cannot be read, so that the engine does not start on
        an executor that cannot act."""
        problems: list[str] = []
        known = set(self._registry.names())
        for name in self._executor_settings:
            if name in LOGICAL_DEFAULTS and name not in known:
                continue  # completed by the settings; a registry without them routes nothing there
            try:
                self._executor(name)
            except Exception as exc:  # any executor's own settings error, as its action says it
                text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                why = str(text).strip() or type(exc).__name__
                problems.append(why if why.startswith("executors.") else f"executors.{name}: {why}")
        if problems:
            raise ExecutorsRefused("\n".join(dict.fromkeys(problems)))

    def _executor(self, name: str) -> Executor:
        with self._lock:
            if name not in self._executors:
                settings = self._executor_settings.get(name)
                self._executors[name] = self._registry.create(name, settings)
            return self._executors[name]

    # --- a batch operation's node steps ------------------------------------------------------
    def run_step(
        self,
        decision: Decision,
        dry_run: bool = False,
        cancelled: Cancel | None = None,
        once: bool = False,
    ) -> Outcome:
        """Run one node step of a batch operation (``gpuops.runtime.batch``) now, in the
        caller's thread: held by the kill switch or pause (audited with the hold, nothing
        run: the operation stops between steps) or a veto its executor reads on the node,
        audited as ``dry_run`` when ``dry_run`` or
        the engine is in dry-run, else its intent written before it runs and its outcome
        after. A replica that no longer leads runs nothing. The step is not a policy's: no
        policy state or guardrail window is fed back; the operation keeps its own record.
        ``cancelled``: asked while the step runs, by an executor that can stop it
        (``gpuops.actions.base.execute``): a step it stops is ``skipped``, ``cancelled: why``.
        ``once``: a temporary failure is not tried again (a health check that timed out has
        failed). Also the remediation ladder's steps (``gpuops.runtime.ladder``)."""
        not_leading = self._not_leading(decision)
        if not_leading is not None:
            return not_leading
        held = self._holds.controlled()
        standing = self._standing(decision) if held is None else None
        if standing is not None and standing.veto:  # a node a site vetoes is never touched
            held = Hold(Suppression.VETO.verdict, f"veto: {standing.veto}")
        if held is not None:
            outcome = Outcome(OutcomeStatus.SKIPPED, error=held.why)
            self._step_held(decision.with_verdict(held.verdict, held.why), outcome)
            return outcome
        if dry_run or self._holds.engine_dry_run():
            why = "the operation is not enforced" if dry_run else "engine is in dry-run"
            planned = decision.with_verdict(Verdict.DRY_RUN, f"{decision.reason}: {why}")
            outcome = Outcome(OutcomeStatus.SKIPPED, error=f"{DRY_RUN_PREFIX}{why}")
            self._step_held(planned, outcome)
            return outcome
        with self._lock:
            self._held_steps.pop(decision.id, None)
        if not self._trail.write_intents([decision]):  # audit before act
            return Outcome(OutcomeStatus.SKIPPED, error=f"not run: {self._trail.problem}")
        self._trail.wrote()
        outcome = self._execute(decision, cancelled, ONCE if once else None)
        self._step_done(decision, outcome)
        return outcome

    def _step_held(self, decision: Decision, outcome: Outcome) -> None:
        """Audit a step held (or run dry) once per hold: a runner that tries it again every
        tick under the same id while the same hold stands (a veto, the kill switch, the
        engine in dry-run) is not told again; a new reason is, and so is the step's run."""
        told = (decision.verdict, decision.reason)
        with self._lock:
            if self._held_steps.get(decision.id) == told:
                return
            if len(self._held_steps) >= HELD_STEPS_KEPT:
                self._held_steps.pop(next(iter(self._held_steps)))
            self._held_steps[decision.id] = told
        self._step_done(decision, outcome)

    def _step_done(self, decision: Decision, outcome: Outcome) -> None:
        """Audit a runner's step with its outcome, then keep it with the decisions (``done``:
        nothing runs it again; reconciliation audits it if the spool refused it; the decision
        pages show it, and an admin's retry names the runner's own way:
        ``retry.STEPS_RETRIED_ELSEWHERE``). The same id again (a step held, then run) keeps
        its latest verdict and outcome."""
        written = self._trail.record(decision, outcome)
        try:
            with self._store.transaction() as db:
                self._store.record_decision(db, decision, DecisionStatus.DONE)
            self._store.finish_decision(decision.id, outcome, decision)
            if written:  # else reconciliation audits it once the spool takes documents again
                self._store.mark_audited([decision.id], Audited.OUTCOME)
        except StateError:  # audited all the same; the operation's own record goes on
            log.exception("step %s not kept with the decisions", decision.id)

    # --- what runs nothing -----------------------------------------------------------------
    def retry(self, decision_id: str) -> Decision:
        """An admin's retry of a failed action (``gpuops.runtime.gate.retry``): its target is
        decided again at the next evaluation, through this gate like any other decision."""
        return retry(self._store, self._locks, self._clock, decision_id)

    def record(self, decision: Decision, outcome: Outcome | None = None) -> None:
        """Audit a decision that runs nothing (a cancelled, denied or expired approval)."""
        self._trail.record(decision, outcome)

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
