"""What a state backend raises: every error names the file or the server and what is wrong,
never a password. Raised by ``gpuops.store.sqlite`` and ``gpuops.store.postgres`` (through
``gpuops.store.sql``, the queries they share) and by ``gpuops.store.lease``; caught by
``gpuops.runtime``, the API and the CLI.

    StateError                  the state cannot be used as it is; nothing was reset
    ├── StateFileMissing        the SQLite file is gone although the engine ran with it before
    ├── StateRowError           one row cannot be decoded (the rest is usable)
    ├── FencedError             a PostgreSQL write refused: this replica is not the leader
    └── DatabaseUnavailable     PostgreSQL cannot be reached, or the connection broke
"""

from __future__ import annotations


class StateError(Exception):
    """The state file cannot be used as it is; the message names the file and what is wrong.
    Nothing was reset: ``gpuops state reset`` does that, keeping the file aside."""


class StateFileMissing(StateError):
    """The state file does not exist although the engine ran with this configuration before
    (its audit spool says so): a volume that is not mounted looks exactly like this."""


class StateRowError(StateError):
    """One row of the state file cannot be decoded; the rest of the file is usable."""

    def __init__(self, message: str, policy: str) -> None:
        super().__init__(message)
        self.policy = policy


class FencedError(StateError):
    """A write refused because this replica no longer holds the lease it was elected with."""


class DatabaseUnavailable(StateError):
    """The database cannot be reached or the connection broke; the message names the server
    (never the password). The next operation reconnects."""
