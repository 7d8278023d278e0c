"""Connections to PostgreSQL: ``Credentials`` (where a replica's password comes from),
``connect`` and ``PgConnection`` (a connection that speaks the ``execute`` of
``gpuops.store.sql.base.Connection``, with ``?`` placeholders, and reconnects when it broke).
Messages name the server (``redacted``), never the password. Used by
``gpuops.store.postgres.store`` and ``gpuops.store.lease``, each on a connection of its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from gpuops.store.errors import DatabaseUnavailable, StateError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
"""How long a connection attempt may take before the store reports the database unreachable."""


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
            f"{redacted(url)}: cannot connect ({first_line(exc, password)})"
        ) from None


def first_line(exc: BaseException, secret: str | None) -> str:
    """The first line of ``exc``'s message (its type when it has none), ``secret`` masked."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.replace(secret, "***") if secret else text


class PgConnection:
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

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> psycopg.Cursor[tuple[Any, ...]]:
        try:
            return self.raw.execute(sql.replace("?", "%s"), tuple(params))
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{redacted(self._url)}: {first_line(exc, None)}") from exc

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> None:
        try:
            with self.raw.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), [tuple(p) for p in params])
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{redacted(self._url)}: {first_line(exc, None)}") from exc

    def close(self) -> None:
        self._conn.close()
