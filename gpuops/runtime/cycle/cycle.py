"""``Cycle``: one evaluation of a policy or a group — query → evaluate → judge → commit.

``evaluate_group`` (the engine's scheduler, per group) queries every policy of the group
(``gpuops.runtime.cycle.queries``), runs the pure evaluation
(``gpuops.model.evaluation.evaluate``) and commits them together (group commit:
``gpuops.runtime.cycle.commit``): one transaction for all their states, the windows and their
decisions, one hand-over to the gate (one intent write). ``commit`` is the same step for
decisions made elsewhere: granted approvals, quota grants, Alertmanager triggers. Built by
``gpuops.runtime.facade.Engine``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from gpuops.model.decisions import Decision, Sample, SkippedEvaluation
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.evaluation.step import Freshness
from gpuops.model.rules.model import Group, Policy, cron_time
from gpuops.runtime.controls import Controls, Locks
from gpuops.runtime.cycle.clears import ClearQueries
from gpuops.runtime.cycle.commit import Committed, Committer, Step
from gpuops.runtime.cycle.queries import Queries
from gpuops.runtime.gate import Gate
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from gpuops.sources import MetricsSource
from gpuops.store.errors import StateRowError
from gpuops.store.interface import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LastEvaluation:
    """A policy's last evaluation: when (its evaluation time) and why it was skipped, if it
    was (a failed or stale query; ``None``: evaluated)."""

    at: float
    skipped: str | None = None


class Cycle:
    """Evaluations of the loaded policies, and the commit every decision goes through."""

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
        """``skipped``: told of every evaluation skipped (audited); ``cleared``: of the clears
        of every commit; ``freshness``: the freshness bounds of a policy's group."""
        self._store = store
        self._locks = locks
        self._metrics = metrics
        self._clock = clock
        self._skipped = skipped
        self._freshness = freshness
        self._queries = Queries(prometheus, metrics, freshness)
        self._committer = Committer(
            store=store,
            gate=gate,
            controls=controls,
            locks=locks,
            settings=settings,
            metrics=metrics,
            cleared=cleared,
        )
        self._clear_queries = ClearQueries()
        self.epochs: dict[str, float] = {}  # group -> clock at its first scheduled run
        self.last_evaluation: dict[str, LastEvaluation] = {}  # policy -> its last evaluation
        self.unreadable: dict[str, str] = {}  # policy -> why its stored state cannot be read

    def rules_changed(self, policies: Iterable[str]) -> None:
        """The rules now hold ``policies`` (names): what is kept for a policy that is gone
        (its narrowed ``clear_expr``, the targets it was made for) goes too."""
        self._clear_queries.keep(policies)

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
            self._queries.prefetch_ages(policies, now)
            steps: list[Step] = []
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
                self._committer.commit_steps(steps, now)
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
    ) -> Step | None:
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
        clear_query = self._clear_queries.query(policy, state)
        result = self._queries.result(policy, now, clear_query, answers)
        step = evaluate(policy, result, state, now, self._freshness(policy))
        if step.skipped is not None:
            self._skipped(step.skipped)
        skipped = step.skipped.error if step.skipped is not None else None
        self.last_evaluation[policy.name] = LastEvaluation(now, skipped)
        population = self.population(policy, now, step.decisions) if step.decisions else None
        return Step(policy, step.decisions, step.state, population, state)

    def _unreadable(self, policy: Policy, now: float, exc: StateRowError) -> None:
        self.unreadable[policy.name] = str(exc)
        self._metrics.state_errors.labels(policy.name).inc()
        self._skipped(SkippedEvaluation(policy.name, policy.group, now, str(exc), "bad state"))

    def population(
        self,
        policy: Policy,
        now: float,
        decisions: Iterable[Decision] = (),
        reuse: bool = True,
    ) -> int | None:
        """How many targets ``max_fraction`` of ``policy`` divides by at ``now`` (None: the
        query failed); see ``gpuops.runtime.cycle.queries.Queries.population``."""
        return self._queries.population(policy, now, decisions, reuse)

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
        when ``next_state`` is given). ``granted_by``: an admin grants decisions that waited
        for approval (``gpuops.runtime.cycle.commit.Committer.commit_steps``)."""
        step = Step(policy, decisions, next_state, population)
        (committed,) = self._committer.commit_steps([step], now, granted_by)
        return committed
