"""The engine's state in PostgreSQL (docs/ha.md): what replicas of the engine share, so that a
standby that takes over knows the pending timers, cooldowns, approvals, quota requests and the
decisions the old leader recorded.

``PostgresStore`` runs the queries of ``gpuops.store.sql`` on a psycopg 3 connection
(``gpuops.store.postgres.connection``); only the schema (``gpuops.store.postgres.schema``) and
the transaction differ from SQLite's. Every write transaction of a replica is fenced: it
checks, in the same transaction, that the lease row (``gpuops.store.lease``) still names this
replica with the epoch it was elected with (``FOR SHARE``, so a takeover waits for it to
commit), else ``FencedError`` and nothing is written. Built by ``gpuops.runtime.facade`` and
the ``gpuops state`` commands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from gpuops.store.errors import DatabaseUnavailable, FencedError, StateError
from gpuops.store.postgres.connection import Credentials, PgConnection, first_line, redacted
from gpuops.store.postgres.schema import MIGRATION_LOCK, MIGRATIONS, SCHEMA
from gpuops.store.sql.store import SqlStore


class PostgresStore(SqlStore):
    """The engine's state in a PostgreSQL database (``state.url``). ``fence``: set by the
    leadership once elected, (holder, epoch) checked by every write transaction; None refuses
    writes (a standby writes nothing)."""

    INSERTION_ORDER = "seq"
    _db: PgConnection

    def __init__(
        self,
        url: str,
        credentials: Credentials,
        name: str,
        lease_s: float = 10.0,
        *,
        read_only: bool = False,
    ) -> None:
        """``lease_s``: the lease's length. A transaction left open longer than half of it (a
        paused process) is ended by the server, so its lock on the lease row (the fence's
        ``FOR SHARE``) cannot keep a standby from taking over. ``read_only`` (``gpuops state
        check``): a session that cannot write, and the schema checked, never created or
        migrated."""
        super().__init__(Path(redacted(url)))  # what messages name: the server, not a file
        self.url = url
        self.credentials = credentials
        self.name = name
        self.fence: Callable[[], tuple[str, int] | None] = lambda: None
        self._cache_epoch: int | None = None
        self._session = {"idle_in_transaction_session_timeout": f"{max(500, int(lease_s * 500))}ms"}
        if read_only:
            self._session["default_transaction_read_only"] = "on"
        self._db = PgConnection(url, credentials, f"gpuops {name}", self._session)
        try:
            self._check_schema() if read_only else self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        """Create the schema (version 1) and apply ``MIGRATIONS``, one replica at a time."""
        conn = self._db.raw
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                conn.execute(SCHEMA)
                conn.execute(
                    "INSERT INTO gpuops_schema (id, version) VALUES (1, 1) ON CONFLICT DO NOTHING"
                )
                row = conn.execute("SELECT version FROM gpuops_schema WHERE id = 1").fetchone()
                version = int(row[0]) if row else 1
                if version > len(MIGRATIONS) + 1:
                    raise StateError(
                        f"{self.path}: the database has schema version {version}, newer than"
                        f" this engine's {len(MIGRATIONS) + 1}: upgrade the engine"
                    )
                for number, sql in enumerate(MIGRATIONS[version - 1 :], start=version + 1):
                    conn.execute(sql)
                    conn.execute("UPDATE gpuops_schema SET version = %s WHERE id = 1", (number,))
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"{self.path}: schema: {first_line(exc, None)}") from exc

    def _check_schema(self) -> None:
        """The schema is this engine's (its version and ``MIGRATIONS`` applied), or StateError."""
        try:
            exists = self._db.execute("SELECT to_regclass('gpuops_schema')").fetchone()
            row = self._db.execute(
                "SELECT version FROM gpuops_schema WHERE id = 1"
                if exists is not None and exists[0] is not None
                else "SELECT NULL"
            ).fetchone()
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"{self.path}: schema: {first_line(exc, None)}") from exc
        version = None if row is None or row[0] is None else int(row[0])
        if version != len(MIGRATIONS) + 1:
            found = "no gpuops schema" if version is None else f"schema version {version}"
            raise StateError(
                f"{self.path}: the database has {found}; this gpuops expects schema version"
                f" {len(MIGRATIONS) + 1} (an engine started on it creates or migrates it)"
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _atomic(self) -> Iterator[PgConnection]:
        """One transaction; refused (``FencedError``) unless this replica holds the lease with
        the epoch it was elected with, checked inside the transaction itself."""
        fence = self.fence()
        if fence is None:
            raise FencedError(f"{self.path}: this replica ({self.name}) is not the leader")
        try:
            with self._db.raw.transaction():
                holder, epoch = fence
                row = self._db.execute(
                    "SELECT 1 FROM gpuops_leader WHERE id = 1 AND holder = ? AND epoch = ?"
                    " AND expires_at > clock_timestamp() FOR SHARE",
                    (holder, epoch),
                ).fetchone()
                if row is None:
                    raise FencedError(
                        f"{self.path}: this replica ({self.name}) lost the lease of epoch"
                        f" {epoch}: nothing written"
                    )
                yield self._db
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{self.path}: {first_line(exc, None)}") from exc

    def _check_cache(self) -> None:
        """The cached policy states are sound while this replica leads with one epoch: only
        the leader writes them (fenced). A standby, or a new epoch, reads them afresh."""
        fence = self.fence()
        epoch = fence[1] if fence is not None else None
        if epoch is None or epoch != self._cache_epoch:
            self._forget_cache()
            self._cache_epoch = epoch
