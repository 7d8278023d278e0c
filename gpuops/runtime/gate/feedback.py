"""What an action that changed nothing leaves in its policy's state: a failure or a hold at the
gate is fed back so that its target is decided again at the right time, or not within its
episode.

A permanent failure is not decided again within the episode; a temporary one after ``RETRY_S``
doubled per failure of the episode, at most ``MAX_RETRY_S``; a hold when its guardrail may allow
it (``gpuops.runtime.gate.holds.Hold.retry_at``). None of them starts a cooldown. Called by
``gpuops.runtime.gate.gate.Gate`` after each outcome that is not a success.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuops.model.decisions import Decision, Outcome, Verdict
from gpuops.model.evaluation.settling import failed
from gpuops.model.guardrails import RETRY_S, forget_action, forget_execution
from gpuops.runtime.controls import Locks
from gpuops.runtime.metrics import EngineMetrics
from gpuops.store.interface import Store

log = logging.getLogger(__name__)

MAX_RETRY_S = 3600.0
"""The cap of the backoff between tries of a temporarily failing action (60 s, doubled per
failure of the episode, at most an hour)."""


class Feedback:
    """Failures and holds fed back into the policy's state and the guardrail windows."""

    def __init__(
        self,
        *,
        store: Store,
        locks: Locks,
        metrics: EngineMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._locks = locks
        self._metrics = metrics
        self._clock = clock

    def failure(self, decision: Decision, outcome: Outcome) -> None:
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
            self.unchanged(decision, None)
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
        self.unchanged(decision, self._clock() + delay)

    def unchanged(
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
        waited for its policy, ``gpuops.runtime.returning``)."""
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
