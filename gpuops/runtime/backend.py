"""The engine's state backend, opened from its configuration: the SQLite state file, or with
``state.url`` the PostgreSQL store and its leader lease (docs/ha.md).

Used by ``gpuops.runtime.facade.Engine`` at construction, and by ``gpuops state`` commands
(``previous_run``: whether a missing state file is new or lost).
"""

from __future__ import annotations

from gpuops.audit.spool import segment_paths
from gpuops.settings import EngineConfig
from gpuops.store.errors import StateError
from gpuops.store.interface import Store
from gpuops.store.lease import Lease
from gpuops.store.postgres import PostgresStore
from gpuops.store.postgres.connection import Credentials
from gpuops.store.sqlite import StateStore


def open_store(
    config: EngineConfig, ran_before: str | None, replica: str
) -> tuple[Store, Lease | None]:
    """The SQLite state file, or with ``state.url`` the PostgreSQL store and its lease.
    ``ran_before``: evidence that an engine ran with this configuration (``previous_run``),
    which makes a missing state file an error."""
    state = config.state
    if state.url is None:
        return StateStore(config.state_file, ran_before), None
    credentials = Credentials(state.password_file, state.password_env)
    store = PostgresStore(state.url, credentials, replica, state.lease)
    try:
        lease = Lease(
            state.url, credentials, replica, state.advertise_url, wait_s=state.renew_interval
        )
    except StateError:
        store.close()
        raise
    return store, lease


def previous_run(config: EngineConfig) -> str | None:
    """Evidence that an engine ran with this configuration before (its audit spool holds a
    writer lock file or segments), or None: a missing or empty state file is then an error, not
    new (docs/state.md)."""
    spool = config.audit.spool_dir
    if (spool / ".lock").exists() or segment_paths(spool):
        return f"the audit spool {spool} shows the engine ran before"
    return None
