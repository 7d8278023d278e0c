"""The cycle's commit: judge → store → hand to the gate, shared by policy evaluations, granted
approvals, quota grants and Alertmanager triggers.

``Committer.commit_steps`` runs the pure judge step (``gpuops.model.guardrails.judge_step``)
over one or more policies' evaluations, each seeing the guardrail windows the ones before it
left, then stores every policy state, the windows and every new decision in one transaction
(``started`` when it will run; an id already stored is a replay and does not run) and hands the
new decisions to ``gpuops.runtime.gate.Gate`` at once, which audits them before anything runs
(one intent write). Two kinds of decision change the state only (docs/policies.md, "What is
recorded"): a clear with nothing to undo, and a re-decision that repeats the suppression
already recorded for its target (counted in ``gpuops_engine_suppressed_total`` and in the next
record's ``held_repeats``). A state or windows row that did not change is not written.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from gpuops.model.decisions import Decision, Outcome, Transition, Verdict
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.guardrails import Context, Judgement, judge_step
from gpuops.model.rules.model import Policy
from gpuops.runtime.controls import Controls, Locks
from gpuops.runtime.gate import Gate
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from gpuops.store.interface import ApprovalStatus, DecisionStatus, Store, Transaction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """What a commit did: the judged decisions and the futures of those that run."""

    decisions: tuple[Decision, ...]
    futures: dict[str, Future[Outcome]] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One policy's evaluation, waiting for its judgement: the decisions, the next state, the
    population, and the state it was evaluated from (``read``: an unchanged state is not
    written again)."""

    policy: Policy
    decisions: Sequence[Decision]
    state: PolicyState | None
    population: int | None
    read: PolicyState | None = None


class NotGranted(Exception):
    """A granted decision that may not run now (the message says why): nothing was stored."""


class Committer:
    """Judges, stores and hands decisions to the gate."""

    def __init__(
        self,
        *,
        store: Store,
        gate: Gate,
        controls: Controls,
        locks: Locks,
        settings: GuardrailSettings,
        metrics: EngineMetrics,
        cleared: Callable[[Sequence[Decision], float], None],
    ) -> None:
        """``cleared``: told of the clears of each commit (their targets' approvals still
        waiting are cancelled, ``gpuops.runtime.approvals``)."""
        self._store = store
        self._gate = gate
        self._controls = controls
        self._locks = locks
        self._settings = settings
        self._metrics = metrics
        self._cleared = cleared

    def context(self, population: int | None, approved: bool = False) -> Context:
        """What the judge step reads besides the windows: the controls and settings now."""
        return Context(
            kill_switch=self._controls.kill_switch_on(),
            paused=self._controls.paused(),
            engine_dry_run=self._settings.dry_run,
            global_max_per_hour=self._settings.global_max_per_hour,
            population=population,
            approved=approved,
        )

    def commit_steps(
        self, steps: Sequence[Step], now: float, granted_by: str | None = None
    ) -> list[Committed]:
        """Judge the steps in order (each seeing the guardrail windows the ones before it left),
        store every state, the windows and every new decision in one transaction, then hand
        all new decisions to the gate at once (their intents in one spool write).

        ``granted_by``: the decisions waited for approval and this admin grants them. Judged
        as approved; one that may run now is stored with its approval settled as granted in
        the same transaction (``NotGranted`` when any of them may not run, or was settled
        meanwhile: nothing is stored then)."""
        runs: set[str] = set()
        fresh: list[Decision] = []
        judged: list[tuple[Step, Judgement]] = []
        with self._locks.engine:
            windows = before = self._store.guardrail_state()
            for step in steps:
                try:
                    judgement = judge_step(
                        step.policy,
                        step.decisions,
                        step.state,
                        windows,
                        self.context(step.population, approved=granted_by is not None),
                        now,
                    )
                    if granted_by is not None:
                        judgement = _granted(judgement, granted_by)
                except NotGranted:
                    raise
                except Exception:  # one broken policy must not stop the others
                    if len(steps) == 1:
                        raise
                    log.exception("judging the decisions of %s failed", step.policy.name)
                    continue
                windows = judgement.guardrails
                judged.append((step, judgement))
            with self._store.transaction() as db:
                for step, judgement in judged:
                    if granted_by is not None:
                        self._grant(db, judgement, granted_by, now, fresh, runs)
                    state = judgement.policy_state
                    if state is not None and _changed(state, step.read):
                        self._store.save_policy_state(db, step.policy.name, state)
                    if granted_by is None:
                        self._record(db, judgement, now, fresh, runs)
                if windows != before:
                    self._store.save_guardrail_state(db, windows)
        for step, judgement in judged:
            self._count(step.policy, judgement, now)
        futures = self._gate.admit(fresh, runs)
        return [
            Committed(j.decisions, {d.id: futures[d.id] for d in j.decisions if d.id in futures})
            for _, j in judged
        ]

    def _grant(
        self,
        db: Transaction,
        judgement: Judgement,
        user: str,
        now: float,
        fresh: list[Decision],
        runs: set[str],
    ) -> None:
        for decision in judgement.decisions:
            settled = self._store.settle_approval(
                db, decision.id, ApprovalStatus.GRANTED, user, now
            )
            if settled is None:
                raise NotGranted(f"decision {decision.id} was settled meanwhile")
            self._store.rerun_decision(db, decision)
            fresh.append(decision)
            runs.add(decision.id)

    def _record(
        self,
        db: Transaction,
        judgement: Judgement,
        now: float,
        fresh: list[Decision],
        runs: set[str],
    ) -> None:
        recorded: list[tuple[Decision, DecisionStatus]] = []
        for decision in judgement.decisions:
            if decision.id in judgement.repeats or _state_only(decision):
                continue  # counted by ``_count``, not recorded: see ``_state_only``
            run = decision.verdict is Verdict.EXECUTE and decision.action is not None
            recorded.append((decision, DecisionStatus.STARTED if run else DecisionStatus.DONE))
        if not recorded:
            return
        inserted = self._store.record_decisions(db, recorded)  # one statement
        for decision, status in recorded:
            if decision.id not in inserted:
                continue  # a replay: already stored, audited and (if it ran) run
            inserted.discard(decision.id)  # an id twice: its first decision only
            fresh.append(decision)
            if status is DecisionStatus.STARTED:
                runs.add(decision.id)
            if decision.verdict is Verdict.AWAITING_APPROVAL:
                ttl = self._settings.approval_ttl
                self._store.save_approval(db, decision, now, now + ttl)

    def _count(self, policy: Policy, judgement: Judgement, now: float) -> None:
        clears = [d for d in judgement.decisions if d.transition is not Transition.FIRE]
        if clears:  # their targets' approvals still waiting are cancelled, asked for once
            self._cleared(clears, now)
        # counted per label set, not per decision (``labels`` costs ~25 us a call)
        decided: Counter[tuple[str, str, str]] = Counter()
        suppressed: Counter[tuple[str, str]] = Counter()
        told = self._gate.told
        quiet = told.quiet_enabled()
        for decision in judgement.decisions:
            decided[decision.policy, decision.transition.value, decision.verdict.value] += 1
            reason = decision.verdict.suppression
            if reason is not None:
                suppressed[decision.policy, reason.value] += 1
            if not quiet:
                continue
            if _state_only(decision):
                told.quiet(decision, "cleared: nothing to undo")
            elif decision.id in judgement.repeats:
                told.quiet(decision, f"held again as before ({decision.verdict}): counted only")
        for labels, n in decided.items():
            self._metrics.decisions.labels(*labels).inc(n)
        for pair, n in suppressed.items():
            self._metrics.suppressed.labels(*pair).inc(n)


def _granted(judgement: Judgement, user: str) -> Judgement:
    """The judgement of decisions an admin grants: each must run now."""
    granted = []
    for decision in judgement.decisions:
        if decision.verdict is not Verdict.EXECUTE or decision.action is None:
            raise NotGranted(f"granted but not runnable now: {decision.verdict}: {decision.reason}")
        granted.append(replace(decision, reason=f"approved by {user}; {decision.reason}"))
    return replace(judgement, decisions=tuple(granted))


def _changed(state: PolicyState, read: PolicyState | None) -> bool:
    """Whether ``state`` must be stored over ``read``: not when it is the state read, or
    equal to it. A state that shares the read one's targets (``PolicyState.base``: only
    values seen again moved) is handed to the store without comparing the targets (it
    writes only what its refresh is due for)."""
    if state is read:
        return False
    if read is None or state.base is read.base:
        return True
    if state.parent is not None and state.parent.base is read.base:
        return True  # the churn path's state: targets came or went (``Delta.keys``)
    return state != read


def _state_only(decision: Decision) -> bool:
    """A clear with nothing to undo (no ``on_clear``, or its action never ran) changes the
    policy's state only: it is neither stored as a decision nor audited nor shown (one debug
    line); the episode's fire and its suppression or outcome are the record."""
    return decision.transition is Transition.CLEAR and decision.action is None
