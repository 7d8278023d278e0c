"""Durable engine state in one SQLite file (the default backend): the queries of
``gpuops.store.sql`` on one ``sqlite3`` connection guarded by a lock, every write one
transaction (``BEGIN IMMEDIATE``). A restart neither re-fires nor forgets.

Opening checks the file (``gpuops.store.sqlite.integrity``: a file that cannot be trusted is
never reset silently, docs/state.md) and brings its schema to this engine's
(``gpuops.store.sqlite.schema``); a row that cannot be decoded raises ``StateRowError`` for
that row only. Built by ``gpuops.runtime.facade`` and the ``gpuops state`` commands.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuops.model.decisions import Decision
from gpuops.store.errors import StateError
from gpuops.store.interface import DecisionStatus
from gpuops.store.sql.base import CHUNK, Connection
from gpuops.store.sql.decisions import INSERT_DECISION, decision_row
from gpuops.store.sql.store import SqlStore
from gpuops.store.sqlite.integrity import check_database, check_file, describe
from gpuops.store.sqlite.schema import APPLICATION_ID, MIGRATIONS, SCHEMA


class StateStore(SqlStore):
    """The SQLite store: ``gpuops.store.interface.Store`` on one file."""

    INSERTION_ORDER = "rowid"
    _db: sqlite3.Connection

    def __init__(self, path: Path | str, previous_run: str | None = None) -> None:
        """Open (or create) the state file at ``path``, or raise ``StateError``.

        ``previous_run``: evidence that the engine ran with this file before (e.g. "the audit
        spool var/audit was written before"), or None. With it, a missing file is an error
        (``StateFileMissing``: lost, or its volume not mounted) and so is an empty one (it was
        truncated); without it, either is taken as new (an empty one made by ``touch``)."""
        super().__init__(Path(path))
        memory = str(path) == ":memory:"
        if not memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            check_file(self.path, previous_run)
        self._data_version = -1
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            if not memory:
                check_database(self._db, self.path)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            self._migrate()
            if int(self._db.execute("PRAGMA application_id").fetchone()[0]) != APPLICATION_ID:
                self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateError(f"{self.path}: {describe(self.path, exc)}") from exc
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        """Bring an older state file to ``MIGRATIONS``' version (``PRAGMA user_version``),
        each step in its own transaction; a newer file's is refused (``StateError``), as
        PostgreSQL's is: an older engine would read stale values (``policy_seen``)."""
        with self._lock:
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > len(MIGRATIONS):  # a newer engine's file (a downgrade)
                raise StateError(
                    f"{self.path}: the state file has schema version {version}, newer than"
                    f" this engine's {len(MIGRATIONS)}: upgrade the engine"
                )
            for number, sql in enumerate(MIGRATIONS[version:], start=version + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in (sql,) if isinstance(sql, str) else sql:
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {number}")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _atomic(self) -> Iterator[sqlite3.Connection]:
        """One transaction of the backend: committed when the block ends, else rolled back."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_cache(self) -> None:
        """Forget the cached policy states when another connection committed to the file since
        (``PRAGMA data_version`` changes then, and only then): the cache is this process's own
        writes and reads, sound while no one else writes (call with the lock held)."""
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        if version != self._data_version:
            self._data_version = version
            self._forget_cache()

    def record_decisions(
        self, db: Connection, decisions: Sequence[tuple[Decision, DecisionStatus]]
    ) -> set[str]:
        """``record_decision`` of each of ``decisions`` in order, in one statement: the ids it
        inserted (the others are replays, or a repeat of an id before them). The ids known
        are read first (``BEGIN IMMEDIATE`` holds the file's one writer: none can come
        between), the others written with one ``executemany`` (``ON CONFLICT DO NOTHING``
        still) instead of one ``execute`` per decision: an evaluation in which many targets
        churn records a few thousand."""
        known: set[str] = set()
        ids = [d.id for d, _ in decisions]
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            known.update(
                r[0]
                for r in db.execute(
                    f"SELECT id FROM decisions WHERE id IN ({','.join('?' * len(chunk))})", chunk
                )
            )
        new: set[str] = set()
        rows: list[tuple[Any, ...]] = []
        for decision, status in decisions:
            if decision.id in known or decision.id in new:
                continue
            new.add(decision.id)
            rows.append(decision_row(decision, status))
        if rows:
            db.executemany(INSERT_DECISION, rows)
        return new
