"""One evaluation cycle: query → evaluate → judge → commit → hand to the gate.

``Cycle.evaluate_policy`` queries Prometheus (``gpuops.sources.prometheus``), runs the pure
evaluation
(``gpuops.model.evaluation.evaluate``), and ``Cycle.commit`` — shared with Alertmanager triggers and
quota grants — runs the pure judge step (``gpuops.model.guardrails.judge_step``), stores the policy
state, the guardrail windows and every new decision in one transaction (``started`` when it
will run; an id already stored is a replay and does not run) and hands them to
``gpuops.runtime.gate.Gate``, which audits them before anything runs. Two kinds of decision
change the state only (docs/policies.md, "What is recorded"): a clear with nothing to undo,
and a re-decision that repeats the suppression already recorded for its target (counted in
``gpuops_engine_suppressed_total`` and in the next record's ``held_repeats``). Built by
``gpuops.runtime.facade.Engine``; its scheduler calls ``evaluate_group``, which evaluates every
policy of the group and then commits them together (group commit, issue 15): one transaction
for all their states, the windows and their decisions, one hand-over to the gate (one intent
write). A state or windows row that did not change is not written.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from gpuops.model.decisions import (
    Decision,
    Outcome,
    Sample,
    SkippedEvaluation,
    Transition,
    Verdict,
)
from gpuops.model.evaluation import Freshness, PolicyState, QueryResult, Status, evaluate
from gpuops.model.guardrails import Context, Judgement, judge_step, population_expr
from gpuops.model.rules.model import Group, Policy, cron_time
from gpuops.model.staleness import StaleInput
from gpuops.runtime.controls import Controls, Locks
from gpuops.runtime.gate import Gate
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from gpuops.sources import MetricsSource, QueryError
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promql import NARROW_MAX_TARGETS, input_selectors, join_labels, narrowed
from gpuops.store.errors import StateRowError
from gpuops.store.interface import ApprovalStatus, DecisionStatus, Store

log = logging.getLogger(__name__)


POPULATIONS_KEPT = 256
"""Population queries whose count is remembered for their evaluation time (``population``)."""

GC_THRESHOLDS = (50_000, 20, 20)
"""The cyclic garbage collector's thresholds in the engine process (``collect_less``)."""


def collect_less() -> None:
    """Run Python's cyclic garbage collector less often (``GC_THRESHOLDS``; the default is a
    young collection every 700 allocations). A steady round at 10,000 GPUs allocates about a
    million objects (samples, target states) while the policies' states (as many again) stay
    alive, so the default thresholds made the collector scan the whole heap many times a
    round: 2/3 of the engine's CPU (issue 15; 590 -> 210 us per GPU with the collector tuned).
    Almost all of it is freed by reference counting; the collector only finds cycles, which
    the cycle does not make. A process setting: called by ``gpuops engine run`` (and the
    benchmarks that stand in for it), not by the library."""
    gc.set_threshold(*GC_THRESHOLDS)


TIMES_KEPT = 8
"""Evaluation times whose stale input series are remembered."""

CLEARS_KEPT = 2
"""Evaluation times whose ``clear_expr`` results are remembered (a wide one at 50,000 GPUs is
~20,000 samples: kept only for the policies of the group run that asked it)."""


@dataclass(frozen=True)
class Committed:
    """What ``Cycle.commit`` did: the judged decisions and the futures of those that run."""

    decisions: tuple[Decision, ...]
    futures: dict[str, Future[Outcome]] = field(default_factory=dict)


@dataclass(frozen=True)
class LastEvaluation:
    """A policy's last evaluation: when (its evaluation time) and why it was skipped, if it
    was (a failed or stale query; ``None``: evaluated)."""

    at: float
    skipped: str | None = None


class Cycle:
    def __init__(
        self,
        *,
        store: Store,
        prometheus: MetricsSource,
        gate: Gate,
        controls: Controls,
        locks: Locks,
        settings: GuardrailSettings,
        metrics: EngineMetrics,
        clock: Callable[[], float],
        skipped: Callable[[SkippedEvaluation], None],
        cleared: Callable[[Sequence[Decision], float], None],
        freshness: Callable[[Policy], Freshness],
    ) -> None:
        self._store = store
        self._prometheus = prometheus
        self._gate = gate
        self._controls = controls
        self._locks = locks
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._skipped = skipped
        self._cleared = cleared
        self._freshness = freshness
        self.epochs: dict[str, float] = {}  # group -> clock at its first scheduled run
        self.last_evaluation: dict[str, LastEvaluation] = {}  # policy -> its last evaluation
        self.unreadable: dict[str, str] = {}  # policy -> why its stored state cannot be read
        self._populations: dict[str, tuple[float, int]] = {}  # query -> (evaluation time, count)
        # evaluation time -> input selector -> age of its oldest sample (None: no series)
        self._ages: dict[float, dict[tuple[str, float], tuple[Sample, ...]]] = {}
        self._clears: dict[float, dict[str, Sequence[Sample]]] = {}  # time -> query -> result
        self._cache_lock = threading.Lock()
        # policy -> (the targets it was made for, (clear_expr, target labels), its query)
        self._clear_queries: dict[str, tuple[Mapping[str, Any], Any, str | None]] = {}

    def rules_changed(self, policies: Iterable[str]) -> None:
        """The rules now hold ``policies`` (names): what is kept for a policy that is gone
        (its narrowed ``clear_expr``, the targets it was made for) goes too."""
        kept = set(policies)
        with self._cache_lock:
            for name in [n for n in self._clear_queries if n not in kept]:
                self._clear_queries.pop(name, None)

    def evaluate_group(self, group: Group, scheduled: bool = False) -> None:
        """One run of ``group``: every policy queried and evaluated, then all of them judged
        and stored in one transaction (one fsync) and handed to the gate together, which
        writes their intents in one spool write before any runs (group commit)."""
        started = time.monotonic()
        now = cron_time(self._clock()) if scheduled else self._tick(group)
        policies = [
            p
            for p in group.policies
            if p.expr is not None and (p.schedule is not None) == scheduled
        ]
        locks = [self._locks.policy(name) for name in sorted({p.name for p in policies})]
        with ExitStack() as held:  # one writer of each policy's state, in one order everywhere
            for lock in locks:
                held.enter_context(lock)
            self._prefetch_ages(policies, now)
            steps: list[_Step] = []
            answers: dict[str, Sequence[Sample]] = {}  # this run's, by query (dropped after)
            for policy in policies:
                try:
                    step = self._step(policy, now, answers)
                except Exception:  # one broken policy must not stop the others
                    log.exception("evaluation of policy %s failed", policy.name)
                    continue
                if step is not None:
                    steps.append(step)
            if steps:
                self._commit_steps(steps, now)
        self._metrics.evaluation_duration.labels(group.name).observe(time.monotonic() - started)

    def _tick(self, group: Group) -> float:
        """The evaluation time of this run of ``group``: its schedule's grid point, as
        Prometheus does, so that `for: 5s` on a 5 s interval holds after exactly one interval
        however late the scheduler's thread woke up."""
        now = self._clock()
        epoch = self.epochs.get(group.name)
        if epoch is None:
            return now
        return epoch + round((now - epoch) / group.interval_s) * group.interval_s

    def evaluate_policy(self, policy: Policy, now: float | None = None) -> list[Decision]:
        now = self._clock() if now is None else now
        with self._locks.policy(policy.name):  # one writer of this policy's state at a time
            step = self._step(policy, now)
            if step is None:
                return []
            committed = self.commit(policy, step.decisions, step.state, now, step.population)
            return list(committed.decisions)

    def _step(
        self, policy: Policy, now: float, answers: dict[str, Sequence[Sample]] | None = None
    ) -> _Step | None:
        """Read, query and evaluate ``policy`` at ``now`` (the caller holds its lock); None
        when its stored state cannot be read. ``answers``: the group run's answers by query,
        shared by its policies with the same ``expr`` (asked once per query and evaluation
        time, as ``clear_expr`` and populations are)."""
        self._metrics.evaluations.labels(policy.group, policy.name).inc()
        try:
            state = self._store.policy_state(policy.name)
        except StateRowError as exc:  # this policy only, visibly (docs/state.md)
            self._unreadable(policy, now, exc)
            return None
        self.unreadable.pop(policy.name, None)
        result = self._query(policy, now, self._clear_query(policy, state), answers)
        step = evaluate(policy, result, state, now, self._freshness(policy))
        if step.skipped is not None:
            self._skipped(step.skipped)
        skipped = step.skipped.error if step.skipped is not None else None
        self.last_evaluation[policy.name] = LastEvaluation(now, skipped)
        population = self.population(policy, now, step.decisions) if step.decisions else None
        return _Step(policy, step.decisions, step.state, population, state)

    def _unreadable(self, policy: Policy, now: float, exc: StateRowError) -> None:
        self.unreadable[policy.name] = str(exc)
        self._metrics.state_errors.labels(policy.name).inc()
        self._skipped(SkippedEvaluation(policy.name, policy.group, now, str(exc), "bad state"))

    def _clear_query(self, policy: Policy, state: PolicyState) -> str | None:
        """``policy``'s ``clear_expr`` for its firing targets in ``state`` (narrowed where
        sound: ``gpuops.sources.prometheus.narrowed``; None: no target fires). Made again only when
        the targets changed (a steady evaluation keeps ``PolicyState.base``: the same text
        of up to 40 kB is not escaped and printed again every round)."""
        expr = policy.clear_expr
        if expr is None:
            return None
        known = self._clear_queries.get(policy.name)
        if known is not None and known[0] is state.base and known[1] == (expr, policy.target):
            return known[2]
        query = _narrowed_clear(expr, policy.target or (), state)
        self._clear_queries[policy.name] = (state.base, (expr, policy.target), query)
        return query

    def _query(
        self,
        policy: Policy,
        now: float,
        clear_query: str | None,
        answers: dict[str, Sequence[Sample]] | None = None,
    ) -> QueryResult:
        """``policy``'s expr, its ``clear_expr`` while a target fires (only for the firing
        targets where that is sound: ``gpuops.sources.prometheus.narrowed``), and the input series
        they read whose newest sample is older than the policy's freshness bound (fresh data
        only: ``gpuops.model.staleness``)."""
        assert policy.expr is not None
        try:
            known = answers.get(policy.expr) if answers is not None else None
            samples = known if known is not None else self._ask(policy.expr, now)
            if answers is not None:
                answers[policy.expr] = samples
            clear = None
            inputs = [policy.expr]
            if policy.clear_expr is not None and clear_query is not None:
                clear = self._clear(clear_query, now)
                inputs.append(policy.clear_expr)
            stale = self._stale(inputs, now, self._freshness(policy).max_sample_age_s)
        except QueryError as exc:
            self._metrics.query_failures.labels(policy.name).inc()
            return QueryResult(error=str(exc))
        return QueryResult(samples, clear, stale=stale)

    def _clear(self, query: str, now: float) -> Sequence[Sample]:
        """``query`` (``_clear_query``) at ``now``, asked once per query and evaluation time."""
        with self._cache_lock:
            known = self._clears.get(now, {}).get(query)
        if known is not None:
            return known
        found = self._ask(query, now)
        with self._cache_lock:
            _remember(self._clears, now, {}, CLEARS_KEPT)[query] = found
        return found

    def _ask(self, expr: str, now: float) -> Sequence[Sample]:
        """``expr`` at ``now``, as columns (``PrometheusClient.query_vector``: the evaluation's
        steady path builds nothing per series) unless the client answers ``query`` its own way
        (the what-if's lockstep cache, a test's fake), which is then asked."""
        if type(self._prometheus).query is PrometheusClient.query:
            return self._prometheus.query_vector(expr, at=now)
        return self._prometheus.query(expr, at=now)

    def _stale(self, exprs: Sequence[str], now: float, bound_s: float) -> tuple[StaleInput, ...]:
        """The input series of ``exprs`` at ``now`` whose newest sample is older than
        ``bound_s``, from those already asked at ``now`` (``_prefetch_ages``) and one query for
        the rest."""
        inputs = list(dict.fromkeys(s for e in exprs for s in input_selectors(e)))
        with self._cache_lock:
            known = dict(self._ages.get(now, {}))
        missing = [s for s in inputs if (s, bound_s) not in known]
        if missing:
            known.update(self._ask_stale(missing, now, bound_s))
        stale = [(s, found) for s in inputs if (found := known[s, bound_s])]
        if not stale:
            return ()
        on, ignoring = join_labels(tuple(exprs))
        return tuple(StaleInput(s, found, on, ignoring) for s, found in stale)

    def _ask_stale(
        self, inputs: Sequence[str], now: float, bound_s: float
    ) -> dict[tuple[str, float], tuple[Sample, ...]]:
        """The stale series of ``inputs`` at ``now`` in one query, remembered for ``now``."""
        found = self._prometheus.stale_series(inputs, bound_s, at=now)
        got = {(s, bound_s): found.get(s, ()) for s in inputs}
        with self._cache_lock:
            _remember(self._ages, now, {}).update(got)
        return got

    def _prefetch_ages(self, policies: Sequence[Policy], now: float) -> None:
        """The stale series of every input of ``policies`` at ``now`` in one query (they
        share it: one probe per group run instead of one per policy). The probe is the same
        for every run of the group (``age_selectors``, all of them when any is not known yet
        at ``now``, with the group's freshness bound), so the what-if can ask it beforehand
        (``gpuops.sim.whatif.group_queries``). A failure is left to each policy's own ask
        (``_stale``), which then skips its evaluation."""
        if not policies:
            return
        selectors = age_selectors(policies)
        bound_s = self._freshness(policies[0]).max_sample_age_s
        with self._cache_lock:
            known = self._ages.get(now, {})
            if all((s, bound_s) in known for s in selectors):
                return
        try:
            self._ask_stale(selectors, now, bound_s)
        except QueryError as exc:
            log.debug("stale input series at %s not known yet: %s", now, exc)

    def population(
        self,
        policy: Policy,
        now: float,
        decisions: Iterable[Decision] = (),
        reuse: bool = True,
    ) -> int | None:
        """How many targets ``max_fraction`` of ``policy`` divides by at ``now`` (None: the
        query failed, which holds what needs it). ``reuse``: a count already made for this
        very evaluation time (by another policy or group evaluated at it) is taken again; the
        gate's recheck at execution passes False and always asks Prometheus, so that a fleet
        that shrank since (a dead rack's series drop out of results at once: staleness
        markers) or a Prometheus that went away is seen then."""
        expr = population_expr(policy, {n for d in decisions for n in d.target.labels})
        if expr is None:
            # max_fraction of targets without labels (`sum(x) > 10`): there is only one
            return 1 if policy.max_fraction is not None else None
        if reuse:
            with self._cache_lock:
                known = self._populations.get(expr)
            if known is not None and known[0] == now:
                return known[1]
        try:
            if policy.population is None:  # ours: one number back, not every target's series
                counted = self._prometheus.query(f"count({expr})", at=now)
                found = int(counted[0].value) if counted else 0
            else:
                found = len(self._prometheus.query(expr, at=now))
        except QueryError as exc:
            log.warning("population of %s unknown: %s", policy.name, exc)
            return None
        if reuse:
            with self._cache_lock:
                if len(self._populations) >= POPULATIONS_KEPT:
                    self._populations.clear()
                self._populations[expr] = (now, found)
        return found

    def context(self, population: int | None, approved: bool = False) -> Context:
        return Context(
            kill_switch=self._controls.kill_switch_on(),
            paused=self._controls.paused(),
            engine_dry_run=self._settings.dry_run,
            global_max_per_hour=self._settings.global_max_per_hour,
            population=population,
            approved=approved,
        )

    def commit(
        self,
        policy: Policy,
        decisions: Sequence[Decision],
        next_state: PolicyState | None,
        now: float,
        population: int | None,
        granted_by: str | None = None,
    ) -> Committed:
        """Judge, store and hand ``decisions`` to the gate (the caller holds the policy's lock
        when ``next_state`` is given).

        ``granted_by``: the decisions waited for approval and this admin grants them. Judged
        as approved; one that may run now is stored with its approval settled as granted in
        the same transaction (``NotGranted`` when any of them may not run, or was settled
        meanwhile: nothing is stored then)."""
        step = _Step(policy, decisions, next_state, population)
        (committed,) = self._commit_steps([step], now, granted_by)
        return committed

    def _commit_steps(
        self, steps: Sequence[_Step], now: float, granted_by: str | None = None
    ) -> list[Committed]:
        """Judge the steps in order (each seeing the guardrail windows the ones before it left),
        store every state, the windows and every new decision in one transaction, then hand
        all new decisions to the gate at once (their intents in one spool write)."""
        runs: set[str] = set()
        fresh: list[Decision] = []
        judged: list[tuple[_Step, Judgement]] = []
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
        db: Any,
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
        self, db: Any, judgement: Judgement, now: float, fresh: list[Decision], runs: set[str]
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
        # counted per label set, not per decision (``labels`` is ~25 us a call: issue 15)
        decided: Counter[tuple[str, str, str]] = Counter()
        suppressed: Counter[tuple[str, str]] = Counter()
        for decision in judgement.decisions:
            decided[decision.policy, decision.transition.value, decision.verdict.value] += 1
            reason = decision.verdict.suppression
            if reason is not None:
                suppressed[decision.policy, reason.value] += 1
            if _state_only(decision):
                log.debug("%s cleared on %s: nothing to undo", policy.name, decision.target.key)
        for labels, n in decided.items():
            self._metrics.decisions.labels(*labels).inc(n)
        for pair, n in suppressed.items():
            self._metrics.suppressed.labels(*pair).inc(n)


def _narrowed_clear(expr: str, names: Sequence[str], state: PolicyState) -> str | None:
    """``expr`` narrowed to the firing targets of ``state`` (``narrowed``), ``expr`` itself
    where it cannot be, None when none fires. Where the first ``2 * NARROW_MAX_TARGETS + 1``
    firing targets already hold more values of one label than ``narrowed`` narrows to, its
    answer is known (None: the wide query) without reading the other targets' labels
    (issue 15: with churn the base changes every round, and ``narrowed`` read every firing
    target of every policy with a ``clear_expr``: 17 % of a round's CPU where thousands of
    them fire)."""
    firing = (t.labels for t in state.base.values() if t.status is not Status.PENDING)
    head = list(islice(firing, 2 * NARROW_MAX_TARGETS + 1))
    if not head:
        return None
    if len(head) > NARROW_MAX_TARGETS:
        for name in names:
            if name != "__name__" and len({t.get(name, "") for t in head}) > NARROW_MAX_TARGETS:
                return expr
    head.extend(firing)
    return narrowed(expr, names, head) or expr


def age_selectors(policies: Iterable[Policy]) -> tuple[str, ...]:
    """The inputs of ``policies``' expressions and clear expressions, each once, in order: a
    group run asks their stale series first, in one query (``Cycle._prefetch_ages``:
    ``gpuops.sources.prometheus.stale_expr`` of them), which the what-if prefetches."""
    exprs = (e for p in policies for e in (p.expr, p.clear_expr) if e is not None)
    return tuple(dict.fromkeys(s for e in exprs for s in input_selectors(e)))


def _remember(cache: dict[float, Any], at: float, empty: Any, kept: int = TIMES_KEPT) -> Any:
    """The entry of evaluation time ``at`` in ``cache`` (made from ``empty`` when new; the
    oldest times are forgotten past ``kept``)."""
    entry = cache.get(at)
    if entry is None:
        while len(cache) >= kept:
            del cache[min(cache)]
        entry = cache[at] = empty
    return entry


@dataclass(frozen=True)
class _Step:
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
