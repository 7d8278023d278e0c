"""The batch operations' repository: each operation (``batch_operations``: its status and its
record as JSON text) and each of its nodes (``batch_nodes``: where the node is in the procedure,
as JSON text), written as each step ends so that a restarted engine or a new leader resumes
without redoing a finished node. Part of ``gpuops.store.sql.store.SqlStore``; used by
``gpuops.runtime.batch``, which encodes and decodes the JSON.
"""

from __future__ import annotations

from gpuops.store.interface import StoredBatch
from gpuops.store.sql.base import SqlBase


class SqlBatch(SqlBase):
    """``gpuops.store.interface.BatchRepository`` in SQL."""

    def save_batch(self, batch: StoredBatch) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO batch_operations (id, status, data, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET status = excluded.status, data = excluded.data",
                (batch.id, batch.status, batch.data, batch.created_at),
            )

    def batch(self, batch_id: str) -> StoredBatch | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, status, data, created_at FROM batch_operations WHERE id = ?",
                (batch_id,),
            ).fetchone()
        return None if row is None else StoredBatch(str(row[0]), str(row[1]), str(row[2]), row[3])

    def batches(self) -> list[StoredBatch]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, status, data, created_at FROM batch_operations ORDER BY created_at"
            ).fetchall()
        return [StoredBatch(str(i), str(s), str(d), float(c)) for i, s, d, c in rows]

    def save_batch_node(self, batch_id: str, node: str, data: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO batch_nodes (operation, node, data) VALUES (?, ?, ?)"
                " ON CONFLICT (operation, node) DO UPDATE SET data = excluded.data",
                (batch_id, node, data),
            )

    def batch_nodes(self, batch_id: str) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT node, data FROM batch_nodes WHERE operation = ?", (batch_id,)
            ).fetchall()
        return {str(n): str(d) for n, d in rows}
