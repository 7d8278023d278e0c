"""The decisions' repository: every recorded decision (``decisions``: its id, policy, target,
transition, verdict and time in columns, its JSON document in ``data``), where it stands, its
outcome and how much of it the audit spool holds (write-ahead audit: ``audited``).

Part of ``gpuops.store.sql.store.SqlStore``; the runtime's cycle records decisions in its
transaction, the gate stores their outcomes and what the spool holds, the API reads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from gpuops.model.decisions import Decision, Outcome
from gpuops.model.records import decision_doc, decision_from_doc, outcome_doc, outcome_from_doc
from gpuops.store.errors import StateError
from gpuops.store.interface import Audited, DecisionStatus, StoredDecision
from gpuops.store.sql.base import CHUNK, Connection, SqlBase
from gpuops.store.sql.columns import decision_data

INSERT_DECISION = (
    "INSERT INTO decisions (id, policy, target, transition, verdict, at, status,"
    " data, audited) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING"
)
"""A new ``decisions`` row (``decision_row``'s values), unless its id is known."""

COLUMNS = "data, status, outcome, audited, retried_at"
"""The columns of a decisions row that make a ``StoredDecision``."""

_UNAUDITED = "(audited = 0 OR (outcome IS NOT NULL AND audited < 2))"
"""The decisions whose intent, or whose stored outcome, the spool lacks."""


def decision_row(decision: Decision, status: DecisionStatus) -> tuple[Any, ...]:
    """The values of a new ``decisions`` row (``INSERT_DECISION``)."""
    return (
        decision.id,
        decision.policy,
        decision.target.key,
        decision.transition.value,
        decision.verdict.value,
        decision.at,
        status.value,
        decision_data(decision),
    )


class SqlDecisions(SqlBase):
    """``gpuops.store.interface.DecisionRepository`` in SQL."""

    INSERTION_ORDER: ClassVar[str]
    """The column that orders rows of one ``at`` by insertion (SQLite: ``rowid``; PostgreSQL:
    a sequence)."""

    @staticmethod
    def record_decision(db: Connection, decision: Decision, status: DecisionStatus) -> bool:
        """Insert a decision; False when its id is already known (a replay: do not act again)."""
        cur = db.execute(INSERT_DECISION, decision_row(decision, status))
        return cur.rowcount == 1

    def record_decisions(
        self, db: Connection, decisions: Sequence[tuple[Decision, DecisionStatus]]
    ) -> set[str]:
        """``record_decision`` of each of ``decisions`` in order: the ids it inserted (the
        others are replays, or a repeat of an id before them). One ``record_decision`` each:
        under READ COMMITTED (PostgreSQL) a read of the known ids first would not keep another
        connection's insert out (``gpuops.store.sqlite`` reads first: its writer is alone)."""
        return {d.id for d, status in decisions if self.record_decision(db, d, status)}

    @staticmethod
    def rerun_decision(db: Connection, decision: Decision) -> None:
        """A stored decision that runs after all (a granted approval): its new verdict, to be
        audited and run by the gate."""
        db.execute(
            "UPDATE decisions SET verdict = ?, data = ?, status = 'started', outcome = NULL,"
            " audited = 0 WHERE id = ?",
            (decision.verdict.value, json.dumps(decision_doc(decision)), decision.id),
        )

    def finish_decision(
        self, decision_id: str, outcome: Outcome, held: Decision | None = None
    ) -> None:
        """Store a decision's outcome (and, when the gate held it, its new verdict)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE decisions SET status = 'done', outcome = ? WHERE id = ?",
                (json.dumps(outcome_doc(outcome)), decision_id),
            )
            if held is not None:
                _set_verdict(db, decision_id, held.verdict.value, held.reason)

    def mark_audited(self, ids: Sequence[str], level: Audited) -> None:
        """Note that the spool holds the intent (``Audited.INTENT``) or the outcome
        (``Audited.OUTCOME``); never lowers what it holds."""
        with self.transaction() as db:
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                db.execute(
                    f"UPDATE decisions SET audited = ? WHERE audited < ? AND id IN "
                    f"({','.join('?' * len(chunk))})",
                    (int(level), int(level), *chunk),
                )

    def unaudited_ids(self, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` of ``unaudited``'s decisions, without reading the decisions
        (the gate's admission asks this of every decision it records)."""
        found: set[str] = set()
        with self._lock:
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                found.update(
                    row[0]
                    for row in self._db.execute(
                        f"SELECT id FROM decisions WHERE {_UNAUDITED}"
                        f" AND id IN ({','.join('?' * len(chunk))})",
                        tuple(chunk),
                    )
                )
        return found

    def unaudited(self, ids: Sequence[str] | None = None) -> list[StoredDecision]:
        """Decisions whose intent, or whose stored outcome, the spool lacks (``ids``: only
        among those), oldest first."""
        where = _UNAUDITED
        rows: list[tuple[Any, ...]] = []
        with self._lock:
            if ids is None:
                rows = self._db.execute(
                    f"SELECT {COLUMNS} FROM decisions WHERE {where} ORDER BY at"
                ).fetchall()
            else:
                for start in range(0, len(ids), CHUNK):
                    chunk = ids[start : start + CHUNK]
                    rows += self._db.execute(
                        f"SELECT {COLUMNS} FROM decisions WHERE {where}"
                        f" AND id IN ({','.join('?' * len(chunk))}) ORDER BY at",
                        tuple(chunk),
                    ).fetchall()
        return [self._decision_row(r) for r in rows]

    def mark_retried(self, decision_id: str, now: float) -> bool:
        """Accept an admin's retry of ``decision_id`` once (False: it was retried before)."""
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE decisions SET retried_at = ? WHERE id = ? AND retried_at IS NULL",
                (now, decision_id),
            )
            return cur.rowcount == 1

    def failures_in_episode(self, policy: str, target: str, episode_start: float) -> int:
        """How many actions on ``target`` failed in the episode that began at ``episode_start``
        (the exponent of the backoff before the next try)."""
        with self._lock:  # JSON read here, not in SQL: the same query for every backend
            rows = self._db.execute(
                "SELECT data, outcome FROM decisions WHERE policy = ? AND target = ?"
                " AND status = 'done' AND outcome IS NOT NULL",
                (policy, target),
            ).fetchall()
        return sum(
            1
            for data, outcome in rows
            if json.loads(outcome).get("status") == "failure"
            and json.loads(data).get("episode_start") == episode_start
        )

    def decision(self, decision_id: str) -> StoredDecision | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {COLUMNS} FROM decisions WHERE id = ?", (decision_id,)
            ).fetchone()
        return self._decision_row(row) if row else None

    def stored_decisions(self, ids: Sequence[str]) -> dict[str, StoredDecision]:
        """The stored decisions among ``ids``, by id (``decision`` of many, one query per
        ``CHUNK``: the inbox's worker reads those a batch of alerts may repeat or undo)."""
        unique = list(dict.fromkeys(ids))
        rows: list[tuple[Any, ...]] = []
        with self._lock:
            for start in range(0, len(unique), CHUNK):
                chunk = unique[start : start + CHUNK]
                rows += self._db.execute(
                    f"SELECT {COLUMNS} FROM decisions WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
        found = (self._decision_row(row) for row in rows)
        return {stored.id: stored for stored in found}

    def prune(self, older_than: float) -> int:
        """Forget finished decisions and settled approvals older than ``older_than`` (the audit
        trail keeps them); returns how many rows went."""
        with self.transaction() as db:
            gone = db.execute(
                "DELETE FROM decisions WHERE at < ? AND status = 'done'", (older_than,)
            ).rowcount
            gone += db.execute(
                "DELETE FROM approvals WHERE requested_at < ? AND status != 'pending'",
                (older_than,),
            ).rowcount
        return gone

    def unfinished(self) -> list[StoredDecision]:
        """Decisions recorded to run, whose intent is audited and whose outcome never came (the
        engine stopped in between). One whose intent is not written yet is not among them:
        only the gate's admission or reconciliation runs it, after writing it."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {COLUMNS} FROM decisions WHERE status = 'started' AND audited >= 1"
                " ORDER BY at"
            ).fetchall()
        return [self._decision_row(r) for r in rows]

    def decisions(
        self, policy: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[StoredDecision]:
        sql = f"SELECT {COLUMNS} FROM decisions WHERE 1=1"
        args: list[Any] = []
        if policy:
            sql += " AND policy = ?"
            args.append(policy)
        if since is not None:
            sql += " AND at >= ?"
            args.append(since)
        sql += f" ORDER BY at DESC, {self.INSERTION_ORDER} DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            return [self._decision_row(r) for r in self._db.execute(sql, args)]

    def _decision_row(self, row: tuple[Any, ...]) -> StoredDecision:
        try:
            data, status, outcome, audited, retried_at = row
            return StoredDecision(
                decision_from_doc(json.loads(data)),
                DecisionStatus(status),
                outcome_from_doc(json.loads(outcome)) if outcome else None,
                Audited(int(audited)),
                retried_at,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise StateError(
                f"{self.path}: a decisions row cannot be decoded ({type(exc).__name__}: {exc};"
                f" it starts {str(row[0])[:80]!r})"
            ) from exc


def _set_verdict(db: Connection, decision_id: str, verdict: str, reason: str | None) -> None:
    """Set a stored decision's verdict and reason, in its columns and its JSON document,
    inside the caller's transaction (read, change, write: no JSON functions of one SQL
    dialect)."""
    row = db.execute("SELECT data FROM decisions WHERE id = ?", (decision_id,)).fetchone()
    if row is None:
        return
    data = json.loads(row[0])
    data["verdict"] = verdict
    data["reason"] = reason
    db.execute(
        "UPDATE decisions SET verdict = ?, data = ? WHERE id = ?",
        (verdict, json.dumps(data), decision_id),
    )
