"""The SQLite state file's schema: ``SCHEMA`` (its first version), ``MIGRATIONS`` (each change
since, numbered by ``PRAGMA user_version``) and ``APPLICATION_ID``, which marks a gpuops file.
Applied by ``gpuops.store.sqlite.store``; checked by ``gpuops.store.sqlite.integrity``.
``gpuops.store.postgres.schema`` is the same tables on PostgreSQL.
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS policy_state (policy TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS guardrails (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    id TEXT PRIMARY KEY, policy TEXT NOT NULL, target TEXT NOT NULL, transition TEXT NOT NULL,
    verdict TEXT NOT NULL, at REAL NOT NULL, status TEXT NOT NULL, outcome TEXT, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_at ON decisions (at);
CREATE TABLE IF NOT EXISTS controls (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS approvals (
    decision_id TEXT PRIMARY KEY, policy TEXT NOT NULL, target TEXT NOT NULL,
    requested_at REAL NOT NULL, expires_at REAL NOT NULL, status TEXT NOT NULL,
    decided_by TEXT, decided_at REAL, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS alert_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, received_at REAL NOT NULL, alert TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS alert_episodes (
    fingerprint TEXT NOT NULL, starts_at TEXT NOT NULL, status TEXT NOT NULL, seen_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, starts_at, status)
);
"""

SEEN_TABLE = (
    "CREATE TABLE IF NOT EXISTS policy_seen (policy TEXT PRIMARY KEY, at REAL NOT NULL,"
    " data TEXT NOT NULL)"
)
"""Per policy, when (``at``) and the ``last_seen`` and ``value`` its targets had then (``data``:
``[[key, ...], [last_seen, ...] or one last_seen for all, [value, ...]]``): newer than a
target row's own, they are the target's (``gpuops.store.sql.policy_seen``). PostgreSQL makes
the same table (``gpuops.store.postgres.schema``)."""

MIGRATIONS: tuple[str | tuple[str, ...], ...] = (
    # 1: write-ahead audit. ``audited``: 0 = nothing in the spool yet, 1 = the intent (decision
    # and verdict) is, 2 = its outcome is too. A file without the column had audited each
    # decision once it had run: 2.
    "ALTER TABLE decisions ADD COLUMN audited INTEGER NOT NULL DEFAULT 2",
    # 2: a resolved alert that came before its firing's action succeeded waits for it here
    "CREATE TABLE early_resolves (fire_id TEXT PRIMARY KEY, alert TEXT NOT NULL, at REAL NOT NULL)",
    # 3: one row per (policy, target) instead of one JSON document per policy, so that a cycle
    # writes only the targets that changed. Readable rows move; a row that is not a JSON
    # object stays in ``policy_state``, still unreadable (``StateRowError``) until repaired.
    (
        "CREATE TABLE policy_targets (policy TEXT NOT NULL, target TEXT NOT NULL,"
        " data TEXT NOT NULL, PRIMARY KEY (policy, target)) WITHOUT ROWID",
        "INSERT INTO policy_targets (policy, target, data) SELECT p.policy, j.key, j.value"
        " FROM policy_state AS p, json_each(p.data) AS j"
        " WHERE json_valid(p.data) AND json_type(p.data) = 'object'",
        "DELETE FROM policy_state WHERE json_valid(data) AND json_type(data) = 'object'",
    ),
    # 4: an admin's retry of a failed decision is accepted once per decision id
    "ALTER TABLE decisions ADD COLUMN retried_at REAL",
    # 5: quota requests, in this connection's transactions (a file may have the table already,
    # made on a connection of its own: hence IF NOT EXISTS), and its index (6)
    "CREATE TABLE IF NOT EXISTS quota_requests (id TEXT PRIMARY KEY, data TEXT NOT NULL,"
    " status TEXT NOT NULL, requested_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS quota_requests_status ON quota_requests (status)",
    # 7: each policy's latest ``last_seen``/``value`` of all its targets in one row, so a steady
    # cycle rewrites no target row to refresh them (``gpuops.store.sql.policy_seen``)
    SEEN_TABLE,
    # 8: the health events node agents pushed, by id (``gpuops.store.sql.health``)
    (
        "CREATE TABLE IF NOT EXISTS health_events (id TEXT PRIMARY KEY, node TEXT NOT NULL,"
        " gpu TEXT NOT NULL, kind TEXT NOT NULL, xid INTEGER, at REAL NOT NULL,"
        " received_at REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS health_events_gpu ON health_events (node, gpu, at)",
    ),
    # 9: batch operations and where each of their nodes is (``gpuops.store.sql.batch``)
    (
        "CREATE TABLE IF NOT EXISTS batch_operations (id TEXT PRIMARY KEY, status TEXT NOT NULL,"
        " data TEXT NOT NULL, created_at REAL NOT NULL)",
        "CREATE TABLE IF NOT EXISTS batch_nodes (operation TEXT NOT NULL, node TEXT NOT NULL,"
        " data TEXT NOT NULL, PRIMARY KEY (operation, node))",
    ),
    # 10: each node's place on the remediation ladder (``gpuops.store.sql.repairs``)
    "CREATE TABLE IF NOT EXISTS health_repairs (node TEXT PRIMARY KEY, stage TEXT NOT NULL,"
    " data TEXT NOT NULL, updated_at REAL NOT NULL)",
    # 11: each failure domain's pace of repairs (``gpuops.store.sql.repairs``)
    "CREATE TABLE IF NOT EXISTS health_domains (domain TEXT PRIMARY KEY, data TEXT NOT NULL)",
)
"""Schema changes after ``SCHEMA``, in order (one statement, or several run in one
transaction); a state file records how many it has had."""

APPLICATION_ID = 0x6770_6F70
"""``PRAGMA application_id`` of a gpuops state file ("gpop"); files made before it have 0."""

KNOWN_TABLES = frozenset(
    {"policy_state", "guardrails", "decisions", "controls", "approvals", "alert_inbox"}
)
"""Tables of every gpuops state file so far: a file from before ``APPLICATION_ID`` has one."""
