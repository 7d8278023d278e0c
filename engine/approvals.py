"""The approval flow (DESIGN.md §6): decisions of ``approval: required`` policies wait until an
admin grants or denies them, expire after ``guardrails.approval_ttl``, and are cancelled when
their condition clears first.

A mixin of ``engine.runtime.Engine`` (which provides the state store, the rules, the locks and
the action pool); the API calls ``grant`` and ``deny``, the runtime's scheduler
``expire_approvals``, its evaluation ``_cancel_approvals``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from engine.config import EngineConfig
from engine.decisions import Decision, Outcome, Verdict
from engine.evaluation import settle
from engine.guardrails import Context, judge
from engine.metrics import EngineMetrics
from engine.records import decision_from_doc
from engine.rules.model import Policy, RuleSet
from engine.state import StateStore


class ApprovalError(Exception):
    """An approval that cannot be granted or denied (not pending, expired, policy gone)."""


class ApprovalFlow:
    """Grant, deny, expire and cancel approvals; mixed into ``Engine``."""

    store: StateStore
    rules: RuleSet
    config: EngineConfig
    metrics: EngineMetrics
    clock: Callable[[], float]
    _lock: threading.RLock

    def _policy_lock(self, name: str) -> threading.Lock:
        raise NotImplementedError

    def _population(
        self, policy: Policy, now: float, decisions: Iterable[Decision] = ()
    ) -> int | None:
        raise NotImplementedError

    def _submit(self, decision: Decision) -> None:
        raise NotImplementedError

    def _record(self, decision: Decision, outcome: Outcome | None) -> None:
        raise NotImplementedError

    def kill_switch_on(self) -> bool:
        raise NotImplementedError

    def paused(self) -> bool:
        raise NotImplementedError

    def _cancel_approvals(self, cleared: Decision, now: float) -> None:
        """A target cleared while its action waited for approval: nothing is left to approve."""
        for approval in self.store.cancel_approvals(cleared.policy, cleared.target.key, now):
            decision = decision_from_doc(approval["decision"]).with_verdict(
                f"{Verdict.SUPPRESSED.value}:approval_cancelled",
                "the condition cleared before anyone granted it",
            )
            self._record(decision, None)

    def grant(self, decision_id: str, user: str) -> Decision:
        """Run a decision that waited for approval (the kill switch and pause still apply)."""
        now = self.clock()
        self.expire_approvals()
        approval = self.store.approval(decision_id)
        if approval is None:
            raise LookupError(f"no approval for decision {decision_id}")
        if approval["status"] != "pending":
            raise ApprovalError(f"decision {decision_id} is {approval['status']}, not pending")
        decision = decision_from_doc(approval["decision"])
        policy = self.rules.policy(decision.policy)
        if policy is None:
            raise ApprovalError(f"policy {decision.policy!r} is no longer loaded")
        population = self._population(policy, now, (decision,))  # a query: outside the locks
        # lock order everywhere: the policy's lock, then the engine's
        with self._policy_lock(policy.name), self._lock:
            gstate = self.store.guardrail_state()
            ctx = Context(
                kill_switch=self.kill_switch_on(),
                paused=self.paused(),
                approved=True,
                engine_dry_run=self.config.guardrails.dry_run,
                global_max_per_hour=self.config.guardrails.global_max_per_hour,
                population=population,
            )
            judged, gstate = judge(decision, policy, gstate, ctx, now)
            judged = replace(judged, reason=f"approved by {user}; {judged.reason}")
            if judged.verdict != Verdict.EXECUTE.value:
                raise ApprovalError(
                    f"granted but not runnable now: {judged.verdict}: {judged.reason}"
                )
            if self.store.settle_approval(decision_id, "granted", user, now) is None:
                raise ApprovalError(f"decision {decision_id} was settled meanwhile")
            state = settle(self.store.policy_state(policy.name), (judged,), lambda d: now)
            with self.store.transaction() as db:
                self.store.save_guardrail_state(db, gstate)
                self.store.save_policy_state(db, policy.name, state)  # acted: undo on clear
        self.metrics.decisions.labels(judged.policy, judged.transition.value, judged.verdict).inc()
        self._submit(judged)
        return judged

    def deny(self, decision_id: str, user: str) -> Decision:
        approval = self.store.settle_approval(decision_id, "denied", user, self.clock())
        if approval is None:
            raise ApprovalError(f"decision {decision_id} is not pending approval")
        decision = decision_from_doc(approval["decision"]).with_verdict(
            f"{Verdict.SUPPRESSED.value}:denied", f"denied by {user}"
        )
        self._record(decision, None)
        return decision

    def expire_approvals(self) -> list[Decision]:
        now = self.clock()
        expired = []
        for approval in self.store.expired_approvals(now):
            if self.store.settle_approval(approval["decision_id"], "expired", None, now) is None:
                continue
            decision = decision_from_doc(approval["decision"]).with_verdict(
                f"{Verdict.SUPPRESSED.value}:approval_expired",
                f"nobody granted it within {self.config.guardrails.approval_ttl:.0f}s",
            )
            self._record(decision, None)
            expired.append(decision)
        return expired
