"""The PostgreSQL schema: ``SCHEMA`` (version 1: the SQLite file's tables, with a sequence
where SQLite orders by ``rowid``, and the leader lease row) and ``MIGRATIONS`` (each change
since, numbered in ``gpuops_schema``). Applied by ``gpuops.store.postgres.store``.
"""

from __future__ import annotations

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
"""Version 1 of the PostgreSQL schema: SQLite's tables after ``gpuops.store.sqlite.schema``'s
migrations up to 6, plus the schema version and the lease row (``gpuops.store.lease``); later
SQLite migrations come as ``MIGRATIONS`` (SQLite's 7, ``policy_seen``, is PostgreSQL's 2)."""

MIGRATIONS: tuple[str, ...] = (
    # 2: each policy's latest ``last_seen``/``value`` of all its targets in one row
    # (``gpuops.store.sqlite.schema.SEEN_TABLE``: a steady cycle rewrites no target row to
    # refresh them)
    "CREATE TABLE IF NOT EXISTS policy_seen (policy TEXT PRIMARY KEY,"
    " at DOUBLE PRECISION NOT NULL, data TEXT NOT NULL)",
    # 3, 4: the health events node agents pushed, by id (SQLite's 8)
    "CREATE TABLE IF NOT EXISTS health_events (id TEXT PRIMARY KEY, node TEXT NOT NULL,"
    " gpu TEXT NOT NULL, kind TEXT NOT NULL, xid INTEGER, at DOUBLE PRECISION NOT NULL,"
    " received_at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS health_events_gpu ON health_events (node, gpu, at)",
    # 5, 6: batch operations and where each of their nodes is (SQLite's 9)
    "CREATE TABLE IF NOT EXISTS batch_operations (id TEXT PRIMARY KEY, status TEXT NOT NULL,"
    " data TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS batch_nodes (operation TEXT NOT NULL, node TEXT NOT NULL,"
    " data TEXT NOT NULL, PRIMARY KEY (operation, node))",
    # 7: each node's place on the remediation ladder (SQLite's 10)
    "CREATE TABLE IF NOT EXISTS health_repairs (node TEXT PRIMARY KEY, stage TEXT NOT NULL,"
    " data TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
    # 8: each failure domain's pace of repairs (SQLite's 11)
    "CREATE TABLE IF NOT EXISTS health_domains (domain TEXT PRIMARY KEY, data TEXT NOT NULL)",
)
"""Schema changes after ``SCHEMA`` (version 1), in order; ``gpuops_schema.version`` records
how many a database has had. Applied under an advisory lock, so two replicas starting at once
migrate once."""

MIGRATION_LOCK = 0x6770_6F70
"""The advisory lock key held while the schema is created or migrated ("gpop")."""
