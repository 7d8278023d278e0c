"""The leader lease (docs/ha.md): the row ``gpuops_leader`` of the PostgreSQL schema, on a
connection of its own. One replica holds it at a time, with an epoch that fences its writes
(``gpuops.store.postgres.store``); the database's clock decides expiry. ``Lease`` is renewed by
``gpuops.runtime.leadership`` and built by ``gpuops.runtime.facade``; ``LeaderInfo`` is what
the API says of the leader.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gpuops.store.postgres.connection import Credentials, PgConnection


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
        (then it fails, and the next attempt tries again)."""
        self.name = name
        self.api_url = api_url
        self._url = url
        self._lock = threading.Lock()
        timeout = f"{max(100, int(wait_s * 1000))}ms"
        self._db = PgConnection(
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
