"""The controls' repository: the kill switch and the pause as set through the API, one
``controls`` row each (``name`` → the JSON text of who set it and when, which
``gpuops.runtime.controls`` writes and reads). Part of ``gpuops.store.sql.store.SqlStore``.
"""

from __future__ import annotations

from gpuops.store.sql.base import SqlBase


class SqlControls(SqlBase):
    """``gpuops.store.interface.ControlRepository`` in SQL."""

    def control(self, name: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM controls WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def set_control(self, name: str, value: str | None) -> None:
        with self.transaction() as db:
            if value is None:
                db.execute("DELETE FROM controls WHERE name = ?", (name,))
            else:
                db.execute(
                    "INSERT INTO controls VALUES (?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (name, value),
                )
