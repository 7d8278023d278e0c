"""An admin's retry of a failed action (``POST /decisions/{id}/retry``): its target is decided
again at the next evaluation, as a new decision judged and run through the gate like any other.

A permanent failure is otherwise not retried within its episode
(``gpuops.runtime.gate.feedback``). Called through ``gpuops.runtime.gate.gate.Gate.retry``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpuops.model.decisions import Decision, Transition, freeze
from gpuops.model.evaluation.settling import failed
from gpuops.model.evaluation.state import PolicyState, Status
from gpuops.runtime.controls import Locks
from gpuops.store.interface import Store

log = logging.getLogger(__name__)


class RetryError(Exception):
    """An action that cannot be retried now (it did not fail, or its target moved on)."""


STEPS_RETRIED_ELSEWHERE = {
    "batch": "retry its node in the operation (gpuops batch retry, or the batch operation's page)",
    "health-ladder": "its remediation ladder takes its next step itself (docs/health.md)",
}
"""Groups of the steps a runner (not a policy) runs through ``Gate.run_step``, and how their
failure is dealt with instead of this retry."""


def retry(store: Store, locks: Locks, clock: Callable[[], float], decision_id: str) -> Decision:
    """Set the failed decision ``decision_id``'s target to be decided again now (a fire
    whose target still fires; an undo whose target has not fired again) and mark the decision
    retried; returns it (``LookupError``: unknown, ``RetryError``: not retried)."""
    stored = store.decision(decision_id)
    if stored is None:
        raise LookupError(f"no decision {decision_id}")
    if not stored.failed:
        raise RetryError(f"decision {decision_id} did not fail: nothing to retry")
    decision = stored.decision
    instead = STEPS_RETRIED_ELSEWHERE.get(decision.group)
    if instead is not None:
        raise RetryError(f"decision {decision_id} is a step of {decision.policy}: {instead}")
    now = clock()
    with locks.policy(decision.policy), locks.engine:
        state = store.policy_state(decision.policy)
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
        if not store.mark_retried(decision_id, now):
            raise RetryError(
                f"decision {decision_id} was retried already: a failed decision is retried"
                " once (its retry is a decision of its own, which can be retried if it fails)"
            )
        with store.transaction() as db:
            store.save_policy_state(db, decision.policy, after)
    log.warning("retry of %s on %s requested", decision.policy, decision.target.key)
    return decision
