"""Which replica acts: ``Leadership`` renews (or campaigns for) the lease of
``gpuops.store.lease.Lease`` on its own thread, and answers ``leading()`` from the monotonic
clock alone, so a replica that cannot renew — connection lost, process paused — stops acting
before its lease can expire in the database and another replica be elected (docs/ha.md).

Built by the facade, which gates every scheduled job on ``leading()`` and hands ``fence`` to
the PostgreSQL store (every write transaction checks the epoch). With SQLite there is no
lease: ``Leadership(None, ...)`` always leads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuops.store.errors import StateError
from gpuops.store.lease import LeaderInfo, Lease

log = logging.getLogger(__name__)

SAFETY = 0.75
"""The share of the lease a leader counts on after a renewal was sent: it stops acting at
``sent + SAFETY * lease``, while the database keeps the lease until at least ``sent + lease``,
leaving a quarter of the lease for clock-rate differences and the last action's start."""


class NotLeaderError(Exception):
    """A write sent to a standby; the message names the leader (and its API URL when known)."""

    def __init__(self, replica: str, leader: LeaderInfo | None) -> None:
        if leader is not None and leader.holder and leader.expires_in > 0:
            where = f" at {leader.url}" if leader.url else ""
            to = f"the leader is {leader.holder}{where} (epoch {leader.epoch})"
        else:
            to = "no replica holds the lease now; retry in a few seconds"
        super().__init__(f"this engine replica ({replica}) is a standby and takes no writes: {to}")
        self.leader = leader


@dataclass(frozen=True)
class Change:
    """A leadership change of this replica, as audited."""

    elected: bool
    replica: str
    epoch: int
    reason: str


class Leadership:
    """``lease``: the lease row (None: a single engine on SQLite, always the leader)."""

    def __init__(
        self,
        lease: Lease | None,
        *,
        replica: str,
        lease_s: float,
        renew_s: float,
        monotonic: Callable[[], float],
        on_change: Callable[[Change], None],
    ) -> None:
        self._lease = lease
        self.replica = replica
        self._lease_s = lease_s
        self._renew_s = renew_s
        self._monotonic = monotonic
        self._on_change = on_change
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._valid_until = 0.0
        self._leader: LeaderInfo | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def solo(self) -> bool:
        return self._lease is None

    def leading(self) -> bool:
        if self._lease is None:
            return True
        with self._lock:
            return self._epoch is not None and self._monotonic() < self._valid_until

    def fence(self) -> tuple[str, int] | None:
        """(replica, epoch) while leading, for the store's write transactions; else None."""
        with self._lock:
            if self._epoch is None or self._monotonic() >= self._valid_until:
                return None
            return self.replica, self._epoch

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def leader(self) -> LeaderInfo | None:
        """The lease row as last read (None before the first read, and with SQLite)."""
        return self._leader

    def require(self) -> None:
        """Raise ``NotLeaderError`` unless this replica leads (the API's writes)."""
        if not self.leading():
            raise NotLeaderError(self.replica, self._leader)

    # --- the lease loop --------------------------------------------------------------------
    def start(self) -> None:
        """One renewal (or campaign) now — a sole replica leads from its start — then one per
        ``renew_s``."""
        if self._lease is None:
            return
        self.step()
        self._thread = threading.Thread(target=self._loop, name="gpuops-leadership", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._renew_s):
            self.step()

    def step(self) -> None:
        """Renew the lease (leader) or try to take it (standby); demote when it is lost."""
        lease = self._lease
        if lease is None:
            return
        sent = self._monotonic()
        try:
            if self._epoch is not None:
                if self._monotonic() >= self._valid_until:
                    self._demote("the lease ran out before it was renewed")
                elif lease.renew(self._epoch, self._lease_s):
                    with self._lock:
                        self._valid_until = sent + SAFETY * self._lease_s
                else:
                    self._demote("another replica holds the lease now")
            if self._epoch is None:
                epoch = lease.acquire(self._lease_s)
                if epoch is not None:
                    with self._lock:
                        self._epoch = epoch
                        self._valid_until = sent + SAFETY * self._lease_s
                    self._announce(Change(True, self.replica, epoch, "elected"))
            self._leader = lease.current()
        except StateError as exc:
            if self._epoch is not None and self._monotonic() >= self._valid_until:
                self._demote(f"the lease could not be renewed: {exc}")
            else:
                log.warning("leader lease: %s", exc)

    def _demote(self, reason: str) -> None:
        with self._lock:
            epoch, self._epoch = self._epoch, None
        if epoch is not None:
            self._announce(Change(False, self.replica, epoch, reason))

    def _announce(self, change: Change) -> None:
        verb = "became the leader" if change.elected else "stopped leading"
        log.warning(
            "replica %s %s (epoch %d): %s", change.replica, verb, change.epoch, change.reason
        )
        try:
            self._on_change(change)
        except Exception:  # the audit of a change must not stop the lease loop
            log.exception("leadership change hook failed")

    def stop(self) -> None:
        """Stop the loop; a leader gives its lease up so that a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._renew_s + 10)
        lease = self._lease
        if lease is None:
            return
        epoch = self._epoch
        if epoch is not None:
            self._demote("stopped")
            try:
                lease.release(epoch)
            except StateError as exc:
                log.warning("leader lease not released (it expires by itself): %s", exc)
        lease.close()
