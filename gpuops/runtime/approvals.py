"""The approval flow: decisions of ``approval: required`` policies wait until an
admin grants or denies them, expire after ``guardrails.approval_ttl``, and are cancelled when
their condition clears first.

A collaborator of ``gpuops.runtime.facade.Engine``, handed the store, the rulebook, the cycle
(population, commit) and the gate: a granted decision is judged again by the same judge step as
the cycle's (kill switch, pause, dry-run, budgets) and runs only through the gate.
The API calls ``grant`` and ``deny``, the engine's scheduler ``expire``, the cycle ``cancel``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuops.model.decisions import Decision, Suppression
from gpuops.runtime.controls import Locks
from gpuops.runtime.cycle import Cycle, NotGranted
from gpuops.runtime.gate import Gate
from gpuops.runtime.metrics import EngineMetrics
from gpuops.runtime.rulebook import Rulebook
from gpuops.settings import GuardrailSettings
from gpuops.store.errors import StateRowError
from gpuops.store.interface import ApprovalStatus, Store


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

    def cancel(self, cleared: Sequence[Decision], now: float) -> None:
        """Targets cleared while their actions waited for approval: nothing is left to
        approve (the approvals waiting are read once for all of them)."""
        targets = {(d.policy, d.target.key) for d in cleared}
        for approval in self._store.approvals(ApprovalStatus.PENDING):
            if (approval.policy, approval.target) not in targets:
                continue
            if self._settle(approval.decision_id, ApprovalStatus.CANCELLED, None, now):
                self._gate.record(
                    approval.decision.with_verdict(
                        Suppression.APPROVAL_CANCELLED.verdict,
                        "the condition cleared before anyone granted it",
                    )
                )

    def _settle(
        self, decision_id: str, status: ApprovalStatus, user: str | None, now: float
    ) -> bool:
        with self._store.transaction() as db:
            return self._store.settle_approval(db, decision_id, status, user, now) is not None

    def grant(self, decision_id: str, user: str) -> Decision:
        """Run a decision that waited for approval, judged again now (kill switch, pause,
        dry-run and budgets apply) through the cycle's commit — the approval is settled as
        granted in the same transaction that stores the decision to run, so a crash leaves
        either a pending approval or a decision that resume runs — and the gate (which checks
        them once more at execution)."""
        now = self._clock()
        self.expire()
        approval = self._store.approval(decision_id)
        if approval is None:
            raise LookupError(f"no approval for decision {decision_id}")
        if approval.status is not ApprovalStatus.PENDING:
            raise ApprovalError(f"decision {decision_id} is {approval.status}, not pending")
        decision = approval.decision
        policy = self._rulebook.policy(decision.policy)
        if policy is None:
            raise ApprovalError(f"policy {decision.policy!r} is no longer loaded")
        population = self._cycle.population(policy, now, (decision,))  # a query: no locks held
        with self._locks.policy(policy.name):
            try:
                state = self._store.policy_state(policy.name)
            except StateRowError as exc:  # docs/state.md: reset that policy's state first
                raise ApprovalError(f"not granted: {exc}") from exc
            try:
                committed = self._cycle.commit(
                    policy, (decision,), state, now, population, granted_by=user
                )
            except NotGranted as exc:
                raise ApprovalError(str(exc)) from exc
        return committed.decisions[0]

    def deny(self, decision_id: str, user: str) -> Decision:
        approval = self._store.approval(decision_id)
        if approval is None or not self._settle(
            decision_id, ApprovalStatus.DENIED, user, self._clock()
        ):
            raise ApprovalError(f"decision {decision_id} is not pending approval")
        decision = approval.decision.with_verdict(Suppression.DENIED.verdict, f"denied by {user}")
        self._gate.record(decision)
        return decision

    def expire(self) -> list[Decision]:
        now = self._clock()
        expired = []
        for approval in self._store.expired_approvals(now):
            if not self._settle(approval.decision_id, ApprovalStatus.EXPIRED, None, now):
                continue
            decision = approval.decision.with_verdict(
                Suppression.APPROVAL_EXPIRED.verdict,
                f"nobody granted it within {self._settings.approval_ttl:.0f}s",
            )
            self._gate.record(decision)
            expired.append(decision)
        return expired
