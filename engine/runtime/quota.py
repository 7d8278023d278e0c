"""Elastic quota requests: "N more GPUs for project X for 8 hours" (DESIGN.md section 6).

A developer files a request (pending); an admin approves or denies it; an approved request runs
the configured executor's grant verb (``scale_out`` with ``nodes = ceil(gpus / gpus_per_node)``)
and, when its duration is over, the undo verb (``scale_in``) — both as decisions of the
``quota-request`` policy that go through the cycle's judge step and commit and run only through
the gate (kill switch, pause, dry-run, the global budget apply; write-ahead audit). Requests
live in the ``quota_requests`` table of the engine's state file, so a restart neither forgets an
active grant nor leaves one applied forever. A collaborator of ``engine.runtime.facade.Engine``,
whose scheduler runs ``tick`` (also with ``api.listen: null``); ``engine.api.routes.quota``
files, approves and denies.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.config import QuotaSettings
from engine.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    Target,
    Transition,
    Verdict,
)
from engine.decisions import decision_id as make_decision_id
from engine.records import decision_from_doc, outcome_from_doc
from engine.rules.model import Policy
from engine.runtime.controls import Controls
from engine.runtime.cycle import Cycle
from engine.state import Store

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_requests (
    id TEXT PRIMARY KEY, data TEXT NOT NULL, status TEXT NOT NULL, requested_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS quota_requests_status ON quota_requests (status);
"""

STATUSES = ("pending", "applying", "active", "releasing", "ended", "denied", "expired", "failed")


class QuotaError(Exception):
    """A request that cannot be approved, denied or filed (the message says why)."""


@dataclass(frozen=True)
class QuotaRequest:
    id: str
    project: str
    gpus: int
    duration_s: float
    reason: str
    requested_by: str
    requested_at: float
    expires_at: float
    """Until when an admin can approve it."""
    status: str = "pending"
    nodes: int = 0
    pool: str = "default"
    decided_by: str | None = None
    decided_at: float | None = None
    starts_at: float | None = None
    ends_at: float | None = None
    grant_decision: str | None = None
    undo_decision: str | None = None
    error: str | None = None
    release_attempts: int = 0
    """Tries of the undo that did not succeed (part of the next try's decision id)."""


class QuotaStore:
    """The ``quota_requests`` table (its own connection to the engine's state file, or
    ``db``: one to the PostgreSQL store, whose schema has the table)."""

    def __init__(self, path: Path | str, db: Any = None) -> None:
        self._lock = threading.Lock()
        if db is not None:
            self._db = db
            return
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 10000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, request: QuotaRequest) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO quota_requests VALUES (?, ?, ?, ?)",
                (request.id, json.dumps(asdict(request)), request.status, request.requested_at),
            )

    def get(self, request_id: str) -> QuotaRequest | None:
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM quota_requests WHERE id = ?", (request_id,)
            ).fetchone()
        return QuotaRequest(**json.loads(row[0])) if row else None

    def list(self, status: str | None = None, limit: int = 1000) -> list[QuotaRequest]:
        sql, args = "SELECT data FROM quota_requests", [] if status is None else [status]
        if status is not None:
            sql += " WHERE status = ?"
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY requested_at DESC LIMIT ?", [*args, limit])
            return [QuotaRequest(**json.loads(r[0])) for r in rows.fetchall()]

    def move(self, request: QuotaRequest, expected: str) -> bool:
        """Store ``request`` if the stored one is still in status ``expected`` (compare and set:
        two admins approving at once apply it once)."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE quota_requests SET data = ?, status = ? WHERE id = ? AND status = ?",
                (json.dumps(asdict(request)), request.status, request.id, expected),
            )
            return bool(cur.rowcount == 1)


class QuotaManager:
    """Files, approves, denies and ends quota requests through the cycle and the gate."""

    def __init__(
        self,
        *,
        settings: QuotaSettings,
        store: QuotaStore,
        state: Store,
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
        self.store = store
        self._state = state
        self._cycle = cycle
        self._controls = controls
        self._approval_ttl = approval_ttl
        self.clock = clock
        self._lock = threading.Lock()  # one apply/undo at a time

    def submit(
        self, project: str, gpus: int, duration_s: float, reason: str, user: str
    ) -> QuotaRequest:
        self._require_leader()
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
        self.store.add(request)
        log.info("quota request %s: %d GPUs for %s by %s", request.id, gpus, project, user)
        return request

    def get(self, request_id: str) -> QuotaRequest:
        request = self.store.get(request_id)
        if request is None:
            raise LookupError(f"no quota request {request_id}")
        return request

    def approve(self, request_id: str, user: str) -> QuotaRequest:
        self._require_leader()
        request = self._pending(request_id)
        if self._controls.kill_switch_on() or self._controls.paused():
            raise QuotaError("the kill switch is on or the engine is paused: nothing is applied")
        now = self.clock()
        applying = replace(request, status="applying", decided_by=user, decided_at=now)
        if not self.store.move(applying, "pending"):
            raise QuotaError(f"quota request {request_id} was settled meanwhile")
        return self._apply(applying)

    def deny(self, request_id: str, user: str) -> QuotaRequest:
        self._require_leader()
        request = self._pending(request_id)
        denied = replace(request, status="denied", decided_by=user, decided_at=self.clock())
        if not self.store.move(denied, "pending"):
            raise QuotaError(f"quota request {request_id} was settled meanwhile")
        return denied

    def _pending(self, request_id: str) -> QuotaRequest:
        self.tick()
        request = self.get(request_id)
        if request.status != "pending":
            raise QuotaError(f"quota request {request_id} is {request.status}, not pending")
        return request

    def tick(self) -> None:
        """Expire unapproved requests, end those whose time is over, finish interrupted ones."""
        now = self.clock()
        for request in self.store.list("pending"):
            if request.expires_at <= now:
                self.store.move(replace(request, status="expired"), "pending")
        for request in self.store.list("applying"):  # interrupted, or waiting for the audit
            self._apply(request)
        due = [r for r in self.store.list("active") if r.ends_at is not None and r.ends_at <= now]
        for request in due + self.store.list("releasing"):
            self._release(request)

    def _apply(self, request: QuotaRequest) -> QuotaRequest:
        decision = self._decision(request, Transition.FIRE, self.settings.grant_action)
        judged, outcome = self._run(decision)
        now = self.clock()
        if judged.verdict == Verdict.EXECUTE.value and outcome is None:
            return request  # its intent waits for the audit spool: applied once written
        if (outcome is not None and outcome.ok) or judged.verdict == Verdict.DRY_RUN.value:
            done = replace(
                request,
                status="active",
                starts_at=now,
                ends_at=now + request.duration_s,
                grant_decision=decision.id,
                error=None,
            )
        else:
            error = outcome.error if outcome is not None else f"{judged.verdict}: {judged.reason}"
            done = replace(request, status="failed", grant_decision=decision.id, error=error)
        self.store.move(done, "applying")
        return done

    def _release(self, request: QuotaRequest) -> QuotaRequest:
        releasing = replace(request, status="releasing")
        if request.status == "active" and not self.store.move(releasing, "active"):
            return request
        decision = self._decision(releasing, Transition.CLEAR, self.settings.undo_action)
        judged, outcome = self._run(decision)
        if judged.verdict == Verdict.EXECUTE.value and outcome is None:
            return releasing  # waits for the audit spool
        if not ((outcome is not None and outcome.ok) or judged.verdict == Verdict.DRY_RUN.value):
            # held (kill switch, pause) or failed: stays releasing, tried again next tick
            error = outcome.error if outcome is not None else f"{judged.verdict}: {judged.reason}"
            if error and "kill switch" in error:
                log.warning("quota request %s is due to end; held: %s", request.id, error)
            retry = replace(releasing, error=error, release_attempts=releasing.release_attempts + 1)
            self.store.move(retry, "releasing")
            return retry
        ended = replace(releasing, status="ended", undo_decision=decision.id, error=None)
        self.store.move(ended, "releasing")
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
        repeat = request.release_attempts if transition is Transition.CLEAR else 0
        return Decision(
            id=make_decision_id(
                "quota", target.key, request.requested_at, transition.value, repeat
            ),
            policy="quota-request",
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
            known = self._state.decision(decision.id)
            if known is not None:
                outcome = known["outcome"]
                return decision_from_doc(known), outcome_from_doc(outcome) if outcome else None
            policy = Policy(
                name=decision.policy,
                group=decision.group,
                expr=None,
                action=decision.action,
                mode="enforce",
            )
            committed = self._cycle.commit(policy, (decision,), None, self.clock(), None)
            judged = committed.decisions[0]
            future = committed.futures.get(decision.id)
            return judged, future.result() if future is not None else None


def request_doc(request: QuotaRequest) -> dict[str, Any]:
    """The JSON form served by the API."""
    return asdict(request)
