"""What holds an action at the moment of execution, in the gate's worker: the kill switch, pause,
its policy removed from the rule set, its age, engine and policy dry-run, then the policy's
guardrails as they stand now (cooldown, max_per_hour, max_fraction) and the global budget
(``gpuops.model.guardrails.recheck``).

Asked by ``gpuops.runtime.gate.gate.Gate`` before each action (``check``) and between its tries
(``controlled``). A held action is audited with its reason like any suppression and decided
again later (``Hold.retry_at``, fed back by ``gpuops.runtime.gate.feedback``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuops.model.decisions import Decision, Suppression, Transition, Verdict
from gpuops.model.guardrails import (
    Context,
    GuardrailState,
    Standing,
    Windows,
    budget_retry_time,
    recheck,
    retry_time,
    summarize,
)
from gpuops.model.rules.model import Policy
from gpuops.runtime.controls import Controls, Locks
from gpuops.settings import GuardrailSettings
from gpuops.store.interface import Store

VETO_RETRY_S = 300.0
"""How long a vetoed target waits before it is decided again (the label may be gone by then)."""

WINDOWS_S = 5.0
"""How long the gate reuses its count of unchanged guardrail windows (an execution that left the
hour's window meanwhile still counts for at most this long: it holds, never lets through)."""


@dataclass(frozen=True)
class Hold:
    """Why the gate holds an action: its verdict and reason; when its target is decided again
    (``retry_at``; None with ``keep_state``: the policy's state is left as it is)."""

    verdict: Verdict
    why: str
    retry_at: float | None = None
    keep_state: bool = False


class Holds:
    """The checks at execution time."""

    def __init__(
        self,
        *,
        settings: GuardrailSettings,
        store: Store,
        controls: Controls,
        locks: Locks,
        clock: Callable[[], float],
        policy: Callable[[str], Policy | None],
        population: Callable[[Policy, Decision], int | None],
        standing: Callable[[Decision], Standing | None] = lambda decision: None,
    ) -> None:
        """``policy``: the policy a decision of that name is held by (None: not loaded);
        ``population``: what ``max_fraction`` divides by now (a query, asked without locks);
        ``standing``: what the decision's executor reads of its target now (a veto, the
        targets already out of service: ``gpuops.actions.base.standing``)."""
        self._settings = settings
        self._store = store
        self._controls = controls
        self._locks = locks
        self._clock = clock
        self._policy = policy
        self._population = population
        self._standing = standing
        self._memo: tuple[GuardrailState, Windows] | None = None

    def controlled(self) -> Hold | None:
        """The kill switch or pause, when on (asked again between an action's tries)."""
        if self._controls.kill_switch_on():
            return Hold(Suppression.KILL_SWITCH.verdict, "the kill switch is on: no action runs")
        if self._controls.paused():
            return Hold(Suppression.PAUSED.verdict, "the engine is paused")
        return None

    def engine_dry_run(self) -> bool:
        """Whether the engine runs in dry-run (``guardrails.dry_run``)."""
        return self._settings.dry_run

    def check(self, decision: Decision) -> Hold | None:
        """What holds ``decision`` now (the module docstring lists the checks, in order), or
        None: it runs."""
        controlled = self.controlled()
        if controlled is not None:
            return controlled
        now = self._clock()
        policy = self._policy(decision.policy)
        if policy is None:
            return Hold(
                Suppression.POLICY_REMOVED.verdict,
                f"policy {decision.policy!r} is not in the rule set now: decided again"
                " when it is loaded again",
                retry_at=now,
            )
        age = now - decision.at
        if age > self._settings.action_max_age:
            age = now - self._decided_at(decision)
        if age > self._settings.action_max_age:
            return Hold(
                Suppression.EXPIRED.verdict,
                f"decided {age:.0f}s ago, more than action_max_age"
                f" {self._settings.action_max_age:.0f}s: decided again on fresh data",
                retry_at=now,
            )
        if self._settings.dry_run:
            return Hold(Verdict.DRY_RUN, "engine is in dry-run", keep_state=True)
        if policy.mode == "dry-run":
            return Hold(Verdict.DRY_RUN, "policy mode is dry-run", keep_state=True)
        standing = self._standing(decision)  # the executor reads the target: before the lock
        if standing is not None and standing.veto:
            return Hold(
                Suppression.VETO.verdict, f"veto: {standing.veto}", retry_at=now + VETO_RETRY_S
            )
        if decision.transition is not Transition.FIRE:
            return None  # an undo passes the policy's limits (gpuops.model.guardrails)
        return self._limits(decision, policy, now, standing)

    def _limits(
        self, decision: Decision, policy: Policy, now: float, standing: Standing | None = None
    ) -> Hold | None:
        """The policy's guardrails and the global budget as they stand at ``now``; the
        executor's ``standing`` gives the population and the targets already out of service."""
        population = None
        unavailable = None if standing is None else standing.unavailable
        if policy.max_fraction is not None:
            if (
                policy.population is None  # the policy's own population wins
                and standing is not None
                and standing.population is not None
            ):
                population = standing.population
            else:
                population = self._population(policy, decision)  # a query: before the lock
        with self._locks.engine:
            guard = self._store.guardrail_state()
            windows = self._windows(guard, now)
            budget = self._settings.global_max_per_hour
            ctx = Context(
                global_max_per_hour=budget, population=population, unavailable=unavailable
            )
            found = recheck(decision, policy, windows, ctx, now)
        if found is None:
            return None
        reason, why = found
        retry_at = retry_time(decision.with_verdict(reason.verdict, why), policy, guard, now)
        if reason is Suppression.GLOBAL_BUDGET and budget is not None:  # when it can allow it
            retry_at = budget_retry_time(guard, budget, now)
        return Hold(reason.verdict, why, retry_at=retry_at)

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
