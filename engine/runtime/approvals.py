"""The approval flow (DESIGN.md §6): decisions of ``approval: required`` policies wait until an
admin grants or denies them, expire after ``guardrails.approval_ttl``, and are cancelled when
their condition clears first.

A collaborator of ``engine.runtime.facade.Engine``, handed the store, the rulebook, the cycle
(population, judgement context) and the gate: a granted decision is judged again by the same
judge step as the cycle's (kill switch, pause, dry-run, budgets) and runs only through the gate.
The API calls ``grant`` and ``deny``, the engine's scheduler ``expire``, the cycle ``cancel``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine.config import GuardrailSettings
from engine.decisions import Decision, Suppression, Verdict
from engine.guardrails import judge_step
from engine.metrics import EngineMetrics
from engine.records import decision_doc, decision_from_doc
from engine.runtime.controls import Locks
from engine.runtime.cycle import Cycle
from engine.runtime.gate import Gate
from engine.runtime.rulebook import Rulebook
from engine.state import StateRowError, Store


class ApprovalError(Exception):
    """An approval that cannot be granted or denied (not pending, expired, policy gone)."""


class Approvals:
    """Grant, deny, expire and cancel approvals."""

    def __init__(
        self,
        *,
        store: Store,
        rulebook: Rulebook,
        cycle: Cycle,
        gate: Gate,
        locks: Locks,
        settings: GuardrailSettings,
        metrics: EngineMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._rulebook = rulebook
        self._cycle = cycle
        self._gate = gate
        self._locks = locks
        self._settings = settings
        self._metrics = metrics
        self._clock = clock

    def cancel(self, cleared: Decision, now: float) -> None:
        """A target cleared while its action waited for approval: nothing is left to approve."""
        for approval in self._store.cancel_approvals(cleared.policy, cleared.target.key, now):
            decision = decision_from_doc(approval["decision"]).with_verdict(
                Suppression.APPROVAL_CANCELLED.verdict,
                "the condition cleared before anyone granted it",
            )
            self._gate.record(decision)

    def grant(self, decision_id: str, user: str) -> Decision:
        """Run a decision that waited for approval, judged again now (kill switch, pause,
        dry-run and budgets apply) and run through the gate (which checks them once more)."""
        now = self._clock()
        self.expire()
        approval = self._store.approval(decision_id)
        if approval is None:
            raise LookupError(f"no approval for decision {decision_id}")
        if approval["status"] != "pending":
            raise ApprovalError(f"decision {decision_id} is {approval['status']}, not pending")
        decision = decision_from_doc(approval["decision"])
        policy = self._rulebook.policy(decision.policy)
        if policy is None:
            raise ApprovalError(f"policy {decision.policy!r} is no longer loaded")
        population = self._cycle.population(policy, now, (decision,))  # a query: no locks held
        with self._locks.policy(policy.name), self._locks.engine:
            try:
                state = self._store.policy_state(policy.name)
            except StateRowError as exc:  # docs/state.md: reset that policy's state first
                raise ApprovalError(f"not granted: {exc}") from exc
            judgement = judge_step(
                policy,
                (decision,),
                state,
                self._store.guardrail_state(),
                self._cycle.context(population, approved=True),
                now,
            )
            judged = judgement.decisions[0]
            judged = replace(judged, reason=f"approved by {user}; {judged.reason}")
            if judged.verdict != Verdict.EXECUTE.value:
                raise ApprovalError(
                    f"granted but not runnable now: {judged.verdict}: {judged.reason}"
                )
            if self._store.settle_approval(decision_id, "granted", user, now) is None:
                raise ApprovalError(f"decision {decision_id} was settled meanwhile")
            with self._store.transaction() as db:
                self._store.save_guardrail_state(db, judgement.guardrails)
                assert judgement.policy_state is not None
                self._store.save_policy_state(db, policy.name, judgement.policy_state)
                self._store.rerun_decision(db, decision_doc(judged))
        self._metrics.decisions.labels(judged.policy, judged.transition.value, judged.verdict).inc()
        self._gate.admit((judged,), {judged.id})
        return judged

    def deny(self, decision_id: str, user: str) -> Decision:
        approval = self._store.settle_approval(decision_id, "denied", user, self._clock())
        if approval is None:
            raise ApprovalError(f"decision {decision_id} is not pending approval")
        decision = decision_from_doc(approval["decision"]).with_verdict(
            Suppression.DENIED.verdict, f"denied by {user}"
        )
        self._gate.record(decision)
        return decision

    def expire(self) -> list[Decision]:
        now = self._clock()
        expired = []
        for approval in self._store.expired_approvals(now):
            if self._store.settle_approval(approval["decision_id"], "expired", None, now) is None:
                continue
            decision = decision_from_doc(approval["decision"]).with_verdict(
                Suppression.APPROVAL_EXPIRED.verdict,
                f"nobody granted it within {self._settings.approval_ttl:.0f}s",
            )
            self._gate.record(decision)
            expired.append(decision)
        return expired
