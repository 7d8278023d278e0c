"""The remediation ladder's repository: each node's place on the ladder (``health_repairs``:
its stage, and its record as JSON text), and each failure domain's pace of repairs
(``health_domains``), written after every change, so that a restarted
engine or a new leader goes on from the step it reached and never does a finished one again.
Part of ``gpuops.store.sql.store.SqlStore``; used by ``gpuops.runtime.ladder``, which encodes
and decodes the JSON.
"""

from __future__ import annotations

from gpuops.store.sql.base import SqlBase


class SqlRepairs(SqlBase):
    """``gpuops.store.interface.RepairRepository`` in SQL."""

    def save_repair(self, node: str, stage: str, data: str, now: float) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO health_repairs (node, stage, data, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (node) DO UPDATE SET stage = excluded.stage, data = excluded.data,"
                " updated_at = excluded.updated_at",
                (node, stage, data, now),
            )

    def repair(self, node: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM health_repairs WHERE node = ?", (node,)
            ).fetchone()
        return None if row is None else str(row[0])

    def repairs(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT node, data FROM health_repairs ORDER BY node"
            ).fetchall()
        return {str(n): str(d) for n, d in rows}

    def save_domain(self, domain: str, data: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO health_domains (domain, data) VALUES (?, ?)"
                " ON CONFLICT (domain) DO UPDATE SET data = excluded.data",
                (domain, data),
            )

    def domains(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute("SELECT domain, data FROM health_domains").fetchall()
        return {str(d): str(v) for d, v in rows}
