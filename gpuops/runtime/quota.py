"""Elastic quota requests: "N more GPUs for project X for 8 hours".

A developer files a request (pending); an admin approves or denies it; an approved request runs
the configured executor's grant verb (``scale_out`` with ``nodes = ceil(gpus / gpus_per_node)``)
and, when its duration is over, the undo verb (``scale_in``) — both as decisions of the
``quota-request`` policy that go through the cycle's judge step and commit and run only through
the gate (kill switch, pause, dry-run, the global budget apply; write-ahead audit). One approved
while the engine runs in dry-run is ``dry_run``: nothing applied, nothing undone at its end, never
applied later (dry-run turned off within its period included). Requests live in the
``quota_requests`` table of the engine's state file, so a restart neither forgets an active grant
nor leaves one applied forever. A collaborator of ``gpuops.runtime.facade.Engine``, whose
scheduler runs ``tick`` (also with ``api.listen: null``); ``gpuops.api.routes.quota`` files,
approves and denies.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
    Verdict,
)
from gpuops.model.decisions import decision_id as make_decision_id
from gpuops.model.guardrails import RETRY_S
from gpuops.model.rules.model import Policy
from gpuops.runtime.controls import Controls
from gpuops.runtime.cycle import Cycle
from gpuops.settings import QuotaSettings
from gpuops.store.interface import QuotaRequest, QuotaStatus, Store

__all__ = [
    "POLICY",
    "ProjectQuota",
    "QuotaError",
    "QuotaManager",
    "QuotaRequest",
    "QuotaStatus",
]

log = logging.getLogger(__name__)

POLICY = "quota-request"
"""The policy name of every quota decision (its grant and its end)."""


class QuotaError(Exception):
    """A request that cannot be approved, denied or filed (the message says why)."""


GRANTED = (QuotaStatus.ACTIVE, QuotaStatus.RELEASING)
"""The states of a request whose GPUs a project has now."""


@dataclass(frozen=True)
class ProjectQuota:
    """One project's quota now: its base (``api.quota.projects``; None: not configured), the
    GPUs its active grants add, their sum, the GPUs its jobs hold (None: not known) and its
    requests waiting for an admin."""

    name: str
    base: int | None
    granted: int
    usage: float | None
    pending: int

    @property
    def quota(self) -> int | None:
        return None if self.base is None else self.base + self.granted


class QuotaManager:
    """Files, approves, denies and ends quota requests through the cycle and the gate."""

    def __init__(
        self,
        *,
        settings: QuotaSettings,
        store: Store,
        cycle: Cycle,
        controls: Controls,
        approval_ttl: float,
        clock: Callable[[], float],
        require_leader: Callable[[], None] = lambda: None,
    ) -> None:
        """``require_leader``: raises on a standby replica (``NotLeaderError``), which files,
        approves and denies nothing."""
        self.settings = settings
        self._require_leader = require_leader
        self._store = store
        self._cycle = cycle
        self._controls = controls
        self._approval_ttl = approval_ttl
        self.clock = clock
        self._lock = threading.Lock()  # one apply/undo at a time

    def submit(
        self, project: str, gpus: int, duration_s: float, reason: str, user: str
    ) -> QuotaRequest:
        self._require_leader()
        known = self.settings.projects
        if known and project not in known:
            raise QuotaError(
                f"project: {project!r} is not one of the projects of api.quota.projects "
                f"({', '.join(sorted(known))})"
            )
        if gpus > self.settings.max_gpus:
            raise QuotaError(f"gpus: {gpus} is more than the limit of {self.settings.max_gpus}")
        if not 0 < duration_s <= self.settings.max_duration:
            raise QuotaError(
                f"duration: {duration_s:.0f}s is not between 1s and the limit of "
                f"{self.settings.max_duration:.0f}s"
            )
        now = self.clock()
        request = QuotaRequest(
            id="q" + secrets.token_hex(8),
            project=project,
            gpus=gpus,
            duration_s=duration_s,
            reason=reason,
            requested_by=user,
            requested_at=now,
            expires_at=now + self._approval_ttl,
            nodes=math.ceil(gpus / self.settings.gpus_per_node),
            pool=self.settings.pool,
        )
        self._store.add_quota_request(request)
        log.info("quota request %s: %d GPUs for %s by %s", request.id, gpus, project, user)
        return request

    def get(self, request_id: str) -> QuotaRequest:
        request = self._store.quota_request(request_id)
        if request is None:
            raise LookupError(f"no quota request {request_id}")
        return request

    def approve(self, request_id: str, user: str) -> QuotaRequest:
        self._require_leader()
        request = self._pending(request_id)
        if request.requested_by == user and not self.settings.self_approval:
            raise QuotaError(
                f"quota request {request_id} was filed by {user}: another admin approves it "
                "(api.quota.self_approval: true lets an admin approve their own)"
            )
        if self._controls.kill_switch_on() or self._controls.paused():
            raise QuotaError("the kill switch is on or the engine is paused: nothing is applied")
        now = self.clock()
        applying = replace(request, status=QuotaStatus.APPLYING, decided_by=user, decided_at=now)
        if not self._store.move_quota_request(applying, QuotaStatus.PENDING):
            raise QuotaError(f"quota request {request_id} was settled meanwhile")
        return self._apply(applying)

    def deny(self, request_id: str, user: str) -> QuotaRequest:
        self._require_leader()
        request = self._pending(request_id)
        denied = replace(
            request, status=QuotaStatus.DENIED, decided_by=user, decided_at=self.clock()
        )
        if not self._store.move_quota_request(denied, QuotaStatus.PENDING):
            raise QuotaError(f"quota request {request_id} was settled meanwhile")
        return denied

    def _pending(self, request_id: str) -> QuotaRequest:
        self.tick()
        request = self.get(request_id)
        if request.status is not QuotaStatus.PENDING:
            raise QuotaError(f"quota request {request_id} is {request.status}, not pending")
        return request

    def tick(self) -> None:
        """Expire unapproved requests, end those whose time is over, finish interrupted ones."""
        now = self.clock()
        store = self._store
        for request in store.quota_requests(QuotaStatus.PENDING):
            if request.expires_at <= now:
                expired = replace(request, status=QuotaStatus.EXPIRED)
                store.move_quota_request(expired, QuotaStatus.PENDING)
        held = self._controls.kill_switch_on() or self._controls.paused()
        # interrupted, waiting for the audit, or held at the gate: decided again (not while
        # the kill switch or pause that held it is still on)
        for request in [] if held else store.quota_requests(QuotaStatus.APPLYING):
            if request.retry_at is None or request.retry_at <= now:
                self._apply(request)
        for request in store.quota_requests(QuotaStatus.ACTIVE):
            if self._granted_in_dry_run(request):  # stored as active by an older engine
                shown = replace(request, status=QuotaStatus.DRY_RUN)
                if store.move_quota_request(shown, QuotaStatus.ACTIVE):
                    log.warning(
                        "quota request %s was approved in dry-run: nothing was applied, so it"
                        " is dry_run, not active, and nothing is undone at its end",
                        request.id,
                    )
        for request in store.quota_requests(QuotaStatus.DRY_RUN):
            if request.ends_at is not None and request.ends_at <= now:
                # nothing was applied, so nothing is undone (also when dry-run is off by now)
                ended = replace(request, status=QuotaStatus.ENDED)
                store.move_quota_request(ended, QuotaStatus.DRY_RUN)
        due = [
            r
            for r in store.quota_requests(QuotaStatus.ACTIVE)
            if r.ends_at is not None and r.ends_at <= now
        ]
        for request in due + store.quota_requests(QuotaStatus.RELEASING):
            self._release(request)

    def _granted_in_dry_run(self, request: QuotaRequest) -> bool:
        """Whether ``request``'s grant was judged dry-run (nothing applied)."""
        if request.grant_decision is None:
            return False
        stored = self._store.decision(request.grant_decision)
        return stored is not None and stored.decision.verdict == Verdict.DRY_RUN.value

    def policy(self) -> Policy:
        """The ``quota-request`` policy its decisions are judged, and held at the gate, by
        (enforce; no limits of its own: the global budget, kill switch, pause, dry-run apply)."""
        return Policy(
            name=POLICY,
            group="quota",
            expr=None,
            action=ActionSpec(self.settings.grant_action, self.settings.executor),
            on_clear=ActionSpec(self.settings.undo_action, self.settings.executor),
            mode="enforce",
        )

    def requests(self, status: QuotaStatus | None = None) -> list[QuotaRequest]:
        """Quota requests, newest first (``status``: only those)."""
        return self._store.quota_requests(status)

    def projects(self, usage: Mapping[str, float] | None) -> list[ProjectQuota]:
        """Every project configured or named by a request, by name: base quota, GPUs granted
        now, ``usage`` (GPUs held by project; None: not known) and pending requests."""
        granted: dict[str, int] = {}
        pending: dict[str, int] = {}
        for request in self._store.quota_requests(None):
            if request.status in GRANTED:
                granted[request.project] = granted.get(request.project, 0) + request.gpus
            elif request.status is QuotaStatus.PENDING:
                pending[request.project] = pending.get(request.project, 0) + 1
        names = {*self.settings.projects, *granted, *pending}
        return [
            ProjectQuota(
                name=name,
                base=self.settings.projects.get(name),
                granted=granted.get(name, 0),
                usage=None if usage is None else usage.get(name, 0.0),
                pending=pending.get(name, 0),
            )
            for name in sorted(names)
        ]

    def _apply(self, request: QuotaRequest) -> QuotaRequest:
        decision = self._decision(request, Transition.FIRE, self.settings.grant_action)
        judged, outcome = self._run(decision)
        now = self.clock()
        if judged.verdict is Verdict.EXECUTE and outcome is None:
            return request  # its intent waits for the audit spool: applied once written
        if _held(judged, outcome):
            # held (kill switch, pause, budget) at judgement or at the gate: stays applying
            # and is decided again, under a new id, when the hold lifts (``tick``)
            error = f"{judged.verdict}: {judged.reason}"
            log.warning("quota request %s held: %s; decided again later", request.id, error)
            retry = replace(
                request,
                error=error,
                apply_attempts=request.apply_attempts + 1,
                retry_at=now + RETRY_S,
            )
            self._store.move_quota_request(retry, QuotaStatus.APPLYING)
            return retry
        if judged.verdict is Verdict.DRY_RUN:
            # approved, not applied: its period is kept to say when it would have ended
            done = replace(
                request,
                status=QuotaStatus.DRY_RUN,
                starts_at=now,
                ends_at=now + request.duration_s,
                grant_decision=decision.id,
                error=None,
                retry_at=None,
            )
        elif outcome is not None and outcome.ok:
            done = replace(
                request,
                status=QuotaStatus.ACTIVE,
                starts_at=now,
                ends_at=now + request.duration_s,
                grant_decision=decision.id,
                error=None,
                retry_at=None,
            )
        else:
            error = (outcome.error if outcome is not None else None) or (
                f"{judged.verdict}: {judged.reason}"
            )
            done = replace(
                request, status=QuotaStatus.FAILED, grant_decision=decision.id, error=error
            )
        self._store.move_quota_request(done, QuotaStatus.APPLYING)
        return done

    def _release(self, request: QuotaRequest) -> QuotaRequest:
        releasing = replace(request, status=QuotaStatus.RELEASING)
        if request.status is QuotaStatus.ACTIVE and not self._store.move_quota_request(
            releasing, QuotaStatus.ACTIVE
        ):
            return request
        decision = self._decision(releasing, Transition.CLEAR, self.settings.undo_action)
        judged, outcome = self._run(decision)
        if judged.verdict is Verdict.EXECUTE and outcome is None:
            return releasing  # waits for the audit spool
        if not ((outcome is not None and outcome.ok) or judged.verdict is Verdict.DRY_RUN):
            # held (kill switch, pause) or failed: stays releasing, tried again next tick
            error = outcome.error if outcome is not None else f"{judged.verdict}: {judged.reason}"
            if error and "kill switch" in error:
                log.warning("quota request %s is due to end; held: %s", request.id, error)
            retry = replace(releasing, error=error, release_attempts=releasing.release_attempts + 1)
            self._store.move_quota_request(retry, QuotaStatus.RELEASING)
            return retry
        ended = replace(releasing, status=QuotaStatus.ENDED, undo_decision=decision.id, error=None)
        self._store.move_quota_request(ended, QuotaStatus.RELEASING)
        return ended

    def _decision(self, request: QuotaRequest, transition: Transition, verb: str) -> Decision:
        target = Target.from_labels(
            {"project": request.project, "pool": request.pool, "quota_request": request.id}, None
        )
        now = self.clock()
        what = f"{request.gpus} GPUs ({request.nodes} nodes) for {request.project}"
        reason = (
            f"quota request {request.id} approved by {request.decided_by}: {what}"
            if transition is Transition.FIRE
            else f"quota request {request.id} ended: {what} released"
        )
        repeat = (
            request.release_attempts if transition is Transition.CLEAR else request.apply_attempts
        )
        return Decision(
            id=make_decision_id(
                "quota", target.key, request.requested_at, transition.value, repeat
            ),
            policy=POLICY,
            group="quota",
            target=target,
            transition=transition,
            action=ActionSpec(
                verb,
                self.settings.executor,
                {"nodes": request.nodes, "gpus": request.gpus, "pool": request.pool},
            ),
            evidence=Evidence(
                expr=f"quota request {request.id}: {request.reason or 'no reason given'}",
                value=float(request.gpus),
                pending_since=request.requested_at,
                observed_at=now,
            ),
            at=now,
            episode_start=request.requested_at,
            repeat=repeat,
            reason=reason,
        )

    def _run(self, decision: Decision) -> tuple[Decision, Outcome | None]:
        """Judge, record and run one quota action through the cycle's commit and the gate,
        like any policy's decision; waits for its outcome. A decision id already stored is not
        run again (a restart between acting and recording): its verdict and outcome are
        returned (outcome None while it has not finished)."""
        assert decision.action is not None
        with self._lock:
            known = self._store.decision(decision.id)
            if known is not None:
                return known.decision, known.outcome
            committed = self._cycle.commit(self.policy(), (decision,), None, self.clock(), None)
            judged = committed.decisions[0]
            future = committed.futures.get(decision.id)
            if future is None:
                return judged, None
            outcome = future.result()
            stored = self._store.decision(decision.id)  # the gate may have held it
            return (stored.decision if stored is not None else judged), outcome


def _held(judged: Decision, outcome: Outcome | None) -> bool:
    """Held back by a guardrail that lifts (kill switch, pause, budget, rate limits), at
    judgement or at the gate: not a failure of the grant."""
    if outcome is not None and outcome.status is not OutcomeStatus.SKIPPED:
        return False
    return judged.suppressed
