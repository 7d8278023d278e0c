"""The health events' repository: every event a node agent pushed (``health_events``), by its
id, so that an event sent again — a retry, a replay, a takeover by another replica — is known,
and the XIDs of a GPU within a threshold's window can be counted again after a restart. Part of
``gpuops.store.sql.store.SqlStore``; used by ``gpuops.runtime.health``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuops.model.health.events import EventKind, HealthEvent
from gpuops.store.sql.base import SqlBase


class SqlHealth(SqlBase):
    """``gpuops.store.interface.HealthRepository`` in SQL."""

    def health_events_add(self, events: Sequence[HealthEvent], now: float) -> set[str]:
        """Keep ``events``; the ids of those not kept before (the rest are duplicates)."""
        new: set[str] = set()
        with self.transaction() as db:
            for e in events:
                row = db.execute(
                    "INSERT INTO health_events (id, node, gpu, kind, xid, at, received_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING RETURNING id",
                    (e.id, e.node, e.gpu, e.kind.value, e.xid, e.at, now),
                ).fetchone()
                if row is not None:
                    new.add(str(row[0]))
        return new

    def health_events_known(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` kept before."""
        known: set[str] = set()
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = list(ids[start : start + 500])
                marks = ", ".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT id FROM health_events WHERE id IN ({marks})", chunk
                ).fetchall()
                known.update(str(r[0]) for r in rows)
        return known

    def health_xids(self, node: str, gpu: str, since: float) -> list[HealthEvent]:
        """The XIDs kept of one GPU at or after ``since``, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, xid, at FROM health_events WHERE node = ? AND gpu = ? AND kind = ?"
                " AND at >= ? ORDER BY at",
                (node, gpu, EventKind.XID.value, since),
            ).fetchall()
        return [HealthEvent(str(i), node, gpu, EventKind.XID, float(a), int(x)) for i, x, a in rows]

    def health_returned(self, node: str) -> float | None:
        """``node``'s last return to service kept (``kind = returned``), or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT MAX(at) FROM health_events WHERE node = ? AND gpu = '' AND kind = ?",
                (node, EventKind.RETURNED.value),
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def prune_health_events(self, older_than: float) -> int:
        """Forget events received before ``older_than``; returns how many went."""
        with self.transaction() as db:
            gone = db.execute("DELETE FROM health_events WHERE received_at < ?", (older_than,))
            return int(gone.rowcount)
