"""What every repository of ``gpuops.store.sql`` stands on: the connection (``Connection``: the
``execute`` that ``sqlite3`` and ``gpuops.store.postgres.connection.PgConnection`` both speak),
its lock, and ``transaction()``, which keeps what the repositories cache equal to what is
committed.

A backend (``gpuops.store.sqlite``, ``gpuops.store.postgres``) opens the connection and
provides ``_atomic`` (one transaction of its own) and ``_check_cache`` (when another writer may
have changed the rows); a repository that caches committed values (policy states, guardrail
windows) extends the ``_discard_pending``, ``_commit_pending`` and ``_forget_cache`` hooks.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol


class Cursor(Protocol):
    """The result of ``Connection.execute``: rows are tuples of column values."""

    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """The part of a DB-API connection the shared queries use, with ``?`` placeholders; it is
    also the handle ``transaction()`` yields (``gpuops.store.interface.Transaction``)."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor: ...
    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> object: ...


CHUNK = 500
"""How many ids one ``IN (...)`` query names at most (SQLite's limit on variables is 999 in
older builds)."""


class SqlBase(ABC):
    """The connection, its lock and the transaction; the repositories of ``gpuops.store.sql``
    extend it and a backend completes it."""

    path: Path
    """What messages name: the state file, or the PostgreSQL server (never a password)."""
    _db: Connection

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction: the repositories' writes that take ``db`` commit together, and
        what they cached of them becomes the committed value only once the commit is done."""
        with self._lock:
            try:
                with self._atomic() as db:
                    self._check_cache()
                    self._discard_pending()
                    yield db
            except BaseException:
                # rolled back, or a COMMIT whose result is unknown (a connection lost while it
                # ran may have committed it): what is cached may no longer be what is stored
                self._discard_pending()
                self._forget_cache()
                raise
            self._commit_pending()

    @abstractmethod
    def close(self) -> None:
        """Close the connection."""

    @abstractmethod
    def _atomic(self) -> AbstractContextManager[Connection]:
        """One transaction of the backend: committed when the block ends, else rolled back."""

    @abstractmethod
    def _check_cache(self) -> None:
        """Call ``_forget_cache`` when another writer may have changed the rows since they
        were cached (call with the lock held)."""

    # The three hooks below are the end of a cooperative chain: a repository that caches
    # extends them and calls ``super()``; nothing is cached here.

    def _discard_pending(self) -> None:
        """A transaction begins or failed: drop what its writes would have cached."""
        return None

    def _commit_pending(self) -> None:
        """A transaction committed: what its writes cached is the committed value now."""
        return None

    def _forget_cache(self) -> None:
        """Drop everything cached from the database (each backend's ``_check_cache`` decides
        when)."""
        return None
