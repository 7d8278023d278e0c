"""The approvals' repository: the decisions of ``approval: required`` policies waiting for (or
settled by) an admin, one ``approvals`` row each with the decision's JSON document as it was
recorded when it began to wait. Part of ``gpuops.store.sql.store.SqlStore``; the runtime's cycle
saves an approval in its transaction, and ``gpuops.runtime.approvals`` settles it.
"""

from __future__ import annotations

import json
from typing import Any

from gpuops.model.decisions import Decision
from gpuops.model.records import decision_doc, decision_from_doc
from gpuops.store.errors import StateError
from gpuops.store.interface import Approval, ApprovalStatus
from gpuops.store.sql.base import Connection, SqlBase

COLUMNS = "requested_at, expires_at, status, decided_by, decided_at, data"
"""The columns of an approvals row that make an ``Approval``."""


class SqlApprovals(SqlBase):
    """``gpuops.store.interface.ApprovalRepository`` in SQL."""

    @staticmethod
    def save_approval(
        db: Connection, decision: Decision, requested_at: float, expires_at: float
    ) -> None:
        db.execute(
            "INSERT INTO approvals (decision_id, policy, target, requested_at,"
            " expires_at, status, data) VALUES (?, ?, ?, ?, ?, 'pending', ?)"
            " ON CONFLICT (decision_id) DO NOTHING",
            (
                decision.id,
                decision.policy,
                decision.target.key,
                requested_at,
                expires_at,
                json.dumps(decision_doc(decision)),
            ),
        )

    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        sql = f"SELECT {COLUMNS} FROM approvals"
        args: tuple[Any, ...] = ()
        if status:
            sql += " WHERE status = ?"
            args = (ApprovalStatus(status).value,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY requested_at DESC", args).fetchall()
        return [self._approval_row(r) for r in rows]

    def approval(self, decision_id: str) -> Approval | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {COLUMNS} FROM approvals WHERE decision_id = ?", (decision_id,)
            ).fetchone()
        return self._approval_row(row) if row else None

    def settle_approval(
        self,
        db: Connection,
        decision_id: str,
        status: ApprovalStatus,
        user: str | None,
        now: float,
    ) -> Approval | None:
        """Move a pending approval to ``status`` inside ``db``; None when it was not pending
        any more."""
        cur = db.execute(
            "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?"
            " WHERE decision_id = ? AND status = 'pending'",
            (status.value, user, now, decision_id),
        )
        if cur.rowcount != 1:
            return None
        row = db.execute(
            f"SELECT {COLUMNS} FROM approvals WHERE decision_id = ?", (decision_id,)
        ).fetchone()
        return self._approval_row(row)

    def expired_approvals(self, now: float) -> list[Approval]:
        return [a for a in self.approvals(ApprovalStatus.PENDING) if a.expires_at <= now]

    def _approval_row(self, row: tuple[Any, ...]) -> Approval:
        requested_at, expires_at, status, decided_by, decided_at, data = row
        try:
            return Approval(
                decision_from_doc(json.loads(data)),
                requested_at,
                expires_at,
                ApprovalStatus(status),
                decided_by,
                decided_at,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise StateError(
                f"{self.path}: an approvals row cannot be decoded ({type(exc).__name__}: {exc})"
            ) from exc
