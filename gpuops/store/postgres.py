"""The PostgreSQL state store and the leader lease (docs/ha.md): what replicas of the engine
share, so that a standby that takes over knows the pending timers, cooldowns, approvals, quota
requests and the decisions the old leader recorded.

``PostgresStore`` runs the queries of ``gpuops.store.sqlite.StateStore`` (written in the SQL both
dialects speak) on a psycopg 3 connection; only the schema, the transaction and the
placeholders differ. Every write transaction of a replica is fenced: it checks, in the same
transaction, that the lease row still names this replica with the epoch it was elected with
(``FOR SHARE``, so a takeover waits for it to commit), else ``FencedError`` and nothing is
written. ``Lease`` is the lease row itself, on its own connection. Called by
``gpuops.runtime`` (the facade builds both; ``gpuops.runtime.leadership`` renews the lease).
Passwords come from a file or the environment and never appear in a message.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from gpuops.store.sqlite import StateError, StateStore

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS gpuops_schema (
    id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS policy_state (policy TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policy_targets (
    policy TEXT NOT NULL, target TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (policy, target)
);
CREATE TABLE IF NOT EXISTS guardrails (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    id TEXT PRIMARY KEY, policy TEXT NOT NULL, target TEXT NOT NULL, transition TEXT NOT NULL,
    verdict TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, status TEXT NOT NULL, outcome TEXT,
    data TEXT NOT NULL, audited INTEGER NOT NULL DEFAULT 0, retried_at DOUBLE PRECISION,
    seq BIGSERIAL
);
CREATE INDEX IF NOT EXISTS decisions_at ON decisions (at);
CREATE INDEX IF NOT EXISTS decisions_status ON decisions (status);
CREATE TABLE IF NOT EXISTS controls (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS approvals (
    decision_id TEXT PRIMARY KEY, policy TEXT NOT NULL, target TEXT NOT NULL,
    requested_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL, decided_by TEXT, decided_at DOUBLE PRECISION, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS alert_inbox (
    id BIGSERIAL PRIMARY KEY, received_at DOUBLE PRECISION NOT NULL, alert TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS alert_episodes (
    fingerprint TEXT NOT NULL, starts_at TEXT NOT NULL, status TEXT NOT NULL,
    seen_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (fingerprint, starts_at, status)
);
CREATE TABLE IF NOT EXISTS early_resolves (
    fire_id TEXT PRIMARY KEY, alert TEXT NOT NULL, at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS quota_requests (
    id TEXT PRIMARY KEY, data TEXT NOT NULL, status TEXT NOT NULL,
    requested_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS quota_requests_status ON quota_requests (status);
CREATE TABLE IF NOT EXISTS gpuops_leader (
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT, url TEXT,
    epoch BIGINT NOT NULL DEFAULT 0, expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch',
    acquired_at TIMESTAMPTZ
);
INSERT INTO gpuops_leader (id) VALUES (1) ON CONFLICT DO NOTHING;
"""
"""Version 1 of the PostgreSQL schema: SQLite's tables after ``gpuops.store.sqlite``'s migrations
up to 6, plus the schema version and the lease row; later SQLite migrations come as
``MIGRATIONS`` (SQLite's 7, ``policy_seen``, is PostgreSQL's 2)."""

MIGRATIONS: tuple[str, ...] = (
    # 2: each policy's latest ``last_seen``/``value`` of all its targets in one row
    # (``gpuops.store.sqlite.SEEN_TABLE``: a steady cycle rewrites no target row to refresh them)
    "CREATE TABLE IF NOT EXISTS policy_seen (policy TEXT PRIMARY KEY,"
    " at DOUBLE PRECISION NOT NULL, data TEXT NOT NULL)",
)
"""Schema changes after ``SCHEMA`` (version 1), in order; ``gpuops_schema.version`` records
how many a database has had. Applied under an advisory lock, so two replicas starting at once
migrate once."""

_MIGRATION_LOCK = 0x6770_6F70
"""The advisory lock key held while the schema is created or migrated ("gpop")."""

CONNECT_TIMEOUT_S = 5
"""How long a connection attempt may take before the store reports the database unreachable."""


class FencedError(StateError):
    """A write refused because this replica no longer holds the lease it was elected with."""


class DatabaseUnavailable(StateError):
    """The database cannot be reached or the connection broke; the message names the server
    (never the password). The next operation reconnects."""


@dataclass(frozen=True)
class Credentials:
    """Where a replica's database password comes from: a file (Docker/Kubernetes secrets) or
    an environment variable, else libpq's own (``PGPASSWORD``, ``~/.pgpass``)."""

    password_file: Path | None = None
    password_env: str | None = None

    def password(self) -> str | None:
        if self.password_file is not None:
            try:
                return self.password_file.read_text().strip()
            except OSError as exc:
                raise StateError(
                    f"state.password_file {self.password_file}: cannot read ({exc.strerror})"
                ) from exc
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise StateError(
                    f"state.password_env: the environment variable {self.password_env} is not set"
                )
            return value
        return None


def redacted(url: str) -> str:
    """``url`` as it may appear in a message: host, port, database and user, no password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<an unparsable PostgreSQL URL>"
    user = str(info.get("user") or "")
    return (
        f"postgresql://{user + '@' if user else ''}{info.get('host', '')}"
        f"{':' + str(info['port']) if info.get('port') else ''}/{info.get('dbname', '')}"
    )


def connect(
    url: str,
    credentials: Credentials,
    application_name: str,
    autocommit: bool = True,
    settings: Mapping[str, str] | None = None,
) -> psycopg.Connection[tuple[Any, ...]]:
    """A connection to ``url`` with the password from ``credentials`` (``DatabaseUnavailable``
    naming the server when it cannot be made); ``settings``: server settings of the session."""
    extra: dict[str, Any] = {
        "application_name": application_name,
        "connect_timeout": CONNECT_TIMEOUT_S,
    }
    if settings:
        extra["options"] = " ".join(f"-c {key}={value}" for key, value in settings.items())
    password = credentials.password()
    if password is not None:
        extra["password"] = password
    try:
        return psycopg.connect(make_conninfo(url, **extra), autocommit=autocommit)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"{redacted(url)}: cannot connect ({_first_line(exc, password)})"
        ) from None


def _first_line(exc: BaseException, secret: str | None) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.replace(secret, "***") if secret else text


class _Connection:
    """A psycopg connection that speaks the ``sqlite3.Connection.execute`` the shared queries
    use: ``?`` placeholders. It reconnects when the connection broke."""

    def __init__(
        self,
        url: str,
        credentials: Credentials,
        name: str,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self._url = url
        self._credentials = credentials
        self._name = name
        self._settings = dict(settings or {})
        self._conn = connect(url, credentials, name, settings=self._settings)

    @property
    def raw(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn.closed or self._conn.broken:
            log.warning("connection to %s lost: reconnecting", redacted(self._url))
            self._conn = connect(self._url, self._credentials, self._name, settings=self._settings)
        return self._conn

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor[tuple[Any, ...]]:
        try:
            return self.raw.execute(sql.replace("?", "%s"), tuple(params))
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{redacted(self._url)}: {_first_line(exc, None)}") from exc

    def executemany(self, sql: str, params: Any) -> None:
        try:
            with self.raw.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), [tuple(p) for p in params])
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{redacted(self._url)}: {_first_line(exc, None)}") from exc

    def close(self) -> None:
        self._conn.close()


class PostgresStore(StateStore):
    """The engine's state in a PostgreSQL database (``state.url``). ``fence``: set by the
    leadership once elected, (holder, epoch) checked by every write transaction; None refuses
    writes (a standby writes nothing)."""

    INSERTION_ORDER = "seq"

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
        self.path = Path(redacted(url))  # what messages name: the server, not a file
        self.url = url
        self.credentials = credentials
        self.name = name
        self.fence: Callable[[], tuple[str, int] | None] = lambda: None
        self._lock = threading.RLock()
        self._states = {}
        self._stored = {}
        self._pending = {}
        self._data_version = -1
        self._cache_epoch: int | None = None
        self._session = {"idle_in_transaction_session_timeout": f"{max(500, int(lease_s * 500))}ms"}
        if read_only:
            self._session["default_transaction_read_only"] = "on"
        self._db = _Connection(  # type: ignore[assignment]
            url, credentials, f"gpuops {name}", self._session
        )
        try:
            self._check_schema() if read_only else self._migrate()
        except BaseException:
            self._pg.close()
            raise

    def _migrate(self) -> None:
        """Create the schema (version 1) and apply ``MIGRATIONS``, one replica at a time."""
        conn = self._pg.raw
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
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
            raise DatabaseUnavailable(f"{self.path}: schema: {_first_line(exc, None)}") from exc

    def _check_schema(self) -> None:
        """The schema is this engine's (its version and ``MIGRATIONS`` applied), or StateError."""
        try:
            exists = self._pg.execute("SELECT to_regclass('gpuops_schema')").fetchone()
            row = self._pg.execute(
                "SELECT version FROM gpuops_schema WHERE id = 1"
                if exists is not None and exists[0] is not None
                else "SELECT NULL"
            ).fetchone()
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"{self.path}: schema: {_first_line(exc, None)}") from exc
        version = None if row is None or row[0] is None else int(row[0])
        if version != len(MIGRATIONS) + 1:
            found = "no gpuops schema" if version is None else f"schema version {version}"
            raise StateError(
                f"{self.path}: the database has {found}; this gpuops expects schema version"
                f" {len(MIGRATIONS) + 1} (an engine started on it creates or migrates it)"
            )

    @property
    def _pg(self) -> _Connection:
        db: Any = self._db
        assert isinstance(db, _Connection)
        return db

    def close(self) -> None:
        with self._lock:
            self._pg.close()

    @contextmanager
    def _atomic(self) -> Iterator[Any]:
        """One transaction; refused (``FencedError``) unless this replica holds the lease with
        the epoch it was elected with, checked inside the transaction itself."""
        fence = self.fence()
        if fence is None:
            raise FencedError(f"{self.path}: this replica ({self.name}) is not the leader")
        try:
            with self._pg.raw.transaction():
                holder, epoch = fence
                row = self._pg.execute(
                    "SELECT 1 FROM gpuops_leader WHERE id = 1 AND holder = ? AND epoch = ?"
                    " AND expires_at > clock_timestamp() FOR SHARE",
                    (holder, epoch),
                ).fetchone()
                if row is None:
                    raise FencedError(
                        f"{self.path}: this replica ({self.name}) lost the lease of epoch"
                        f" {epoch}: nothing written"
                    )
                yield self._pg
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{self.path}: {_first_line(exc, None)}") from exc

    def _check_cache(self) -> None:
        """The cached policy states are sound while this replica leads with one epoch: only
        the leader writes them (fenced). A standby, or a new epoch, reads them afresh."""
        fence = self.fence()
        epoch = fence[1] if fence is not None else None
        if epoch is None or epoch != self._cache_epoch:
            self._forget_cache()
            self._cache_epoch = epoch


@dataclass(frozen=True)
class LeaderInfo:
    """The lease row: who holds it, where its API answers, its epoch, seconds until it
    expires (negative: expired)."""

    holder: str | None
    url: str | None
    epoch: int
    expires_in: float

    @property
    def link(self) -> str | None:
        """``url`` where a header or a page may carry it: an http(s) URL of printable ASCII
        (a replica advertises it; a damaged row must not break an answer), else None."""
        url = self.url
        if url and url.startswith(("http://", "https://")) and all(33 <= ord(c) < 127 for c in url):
            return url
        return None


class Lease:
    """The lease row ``gpuops_leader`` on a connection of its own. The database's clock
    decides expiry, so the replicas' clocks need not agree."""

    def __init__(
        self,
        url: str,
        credentials: Credentials,
        name: str,
        api_url: str | None,
        wait_s: float = 2.0,
    ) -> None:
        """``wait_s``: how long one attempt may wait for the lease row's lock or the server
        (then it fails, and the next round tries again)."""
        self.name = name
        self.api_url = api_url
        self._url = url
        self._lock = threading.Lock()
        timeout = f"{max(100, int(wait_s * 1000))}ms"
        self._db = _Connection(
            url,
            credentials,
            f"gpuops {name} lease",
            {"lock_timeout": timeout, "statement_timeout": timeout},
        )

    def acquire(self, ttl_s: float) -> int | None:
        """Take the lease when it expired (or this replica held it): the new epoch, else None."""
        with self._lock:
            row = self._db.execute(
                "UPDATE gpuops_leader SET holder = ?, url = ?, epoch = epoch + 1,"
                " expires_at = clock_timestamp() + make_interval(secs => ?),"
                " acquired_at = clock_timestamp()"
                " WHERE id = 1 AND (expires_at <= clock_timestamp() OR holder = ?)"
                " RETURNING epoch",
                (self.name, self.api_url, ttl_s, self.name),
            ).fetchone()
        return int(row[0]) if row else None

    def renew(self, epoch: int, ttl_s: float) -> bool:
        """Extend the lease held with ``epoch``; False when another replica holds it now."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE gpuops_leader"
                " SET expires_at = clock_timestamp() + make_interval(secs => ?)"
                " WHERE id = 1 AND holder = ? AND epoch = ?",
                (ttl_s, self.name, epoch),
            )
            return cur.rowcount == 1

    def release(self, epoch: int) -> None:
        """Give the lease up at a clean stop, so that a standby takes over at once."""
        with self._lock:
            self._db.execute(
                "UPDATE gpuops_leader SET expires_at = 'epoch'"
                " WHERE id = 1 AND holder = ? AND epoch = ?",
                (self.name, epoch),
            )

    def current(self) -> LeaderInfo:
        with self._lock:
            row = self._db.execute(
                "SELECT holder, url, epoch, EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))"
                " FROM gpuops_leader WHERE id = 1"
            ).fetchone()
        if row is None:
            return LeaderInfo(None, None, 0, -1.0)
        expires = float(row[3]) if row[3] is not None else -1.0
        return LeaderInfo(row[0], row[1], int(row[2]), expires)

    def close(self) -> None:
        with self._lock:
            self._db.close()
