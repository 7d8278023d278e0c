"""The quota requests' repository: one ``quota_requests`` row per elastic quota request (its JSON
document, ``gpuops.store.codecs.quota_request_doc``, with its status and time in columns to
query by). Part of ``gpuops.store.sql.store.SqlStore``; ``gpuops.runtime.quota`` moves a
request from status to status by compare and set.
"""

from __future__ import annotations

import json

from gpuops.store.codecs import quota_request_doc, quota_request_from_doc
from gpuops.store.errors import StateError
from gpuops.store.interface import QuotaRequest, QuotaStatus
from gpuops.store.sql.base import SqlBase


class SqlQuotaRequests(SqlBase):
    """``gpuops.store.interface.QuotaRepository`` in SQL."""

    def add_quota_request(self, request: QuotaRequest) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO quota_requests VALUES (?, ?, ?, ?)",
                (
                    request.id,
                    json.dumps(quota_request_doc(request)),
                    request.status.value,
                    request.requested_at,
                ),
            )

    def quota_request(self, request_id: str) -> QuotaRequest | None:
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM quota_requests WHERE id = ?", (request_id,)
            ).fetchone()
        return self._quota_row(row[0]) if row else None

    def quota_requests(
        self, status: QuotaStatus | None = None, limit: int = 1000
    ) -> list[QuotaRequest]:
        sql, args = (
            "SELECT data FROM quota_requests",
            [] if status is None else [QuotaStatus(status).value],
        )
        if status is not None:
            sql += " WHERE status = ?"
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY requested_at DESC LIMIT ?", [*args, limit])
            return [self._quota_row(r[0]) for r in rows.fetchall()]

    def move_quota_request(self, request: QuotaRequest, expected: QuotaStatus) -> bool:
        """Store ``request`` if the stored one is still in status ``expected`` (compare and set:
        two admins approving at once apply it once)."""
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE quota_requests SET data = ?, status = ? WHERE id = ? AND status = ?",
                (
                    json.dumps(quota_request_doc(request)),
                    request.status.value,
                    request.id,
                    expected.value,
                ),
            )
            return cur.rowcount == 1

    def _quota_row(self, data: str) -> QuotaRequest:
        try:
            return quota_request_from_doc(json.loads(data))
        except (ValueError, TypeError, KeyError) as exc:
            raise StateError(
                f"{self.path}: a quota_requests row cannot be decoded"
                f" ({type(exc).__name__}: {exc}; it starts {data[:80]!r})"
            ) from exc
