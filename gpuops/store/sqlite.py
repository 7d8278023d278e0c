"""Durable engine state in one SQLite file: policy states, guardrail windows, decisions, controls,
approvals and Alertmanager episodes. A restart neither re-fires nor forgets.

Implements ``gpuops.store.interface.Store`` (the repositories per aggregate) for ``gpuops.runtime``
(and
the API through it). Values in, values out: frozen values of ``gpuops.store.interface``,
``gpuops.model.evaluation`` and ``gpuops.model.guardrails``, stored in the JSON forms of
``gpuops.store.codecs``
and ``gpuops.model.records``. One connection guarded by a lock; every write is one transaction.

A file that cannot be trusted is never reset silently (docs/state.md): opening a missing or an
empty file the engine had written before, a file without the SQLite header, a foreign database
or one that fails ``PRAGMA quick_check`` raises ``StateError`` naming the file and what is wrong;
a row that cannot be decoded raises ``StateRowError`` for that row only. ``gpuops state reset``
(``reset`` here) puts a broken file aside and starts afresh.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from math import inf
from pathlib import Path
from sys import intern
from typing import Any

import orjson

from gpuops.model.decisions import Decision, Outcome, freeze
from gpuops.model.evaluation import PolicyState, Status, TargetState
from gpuops.model.guardrails import Execution, GuardrailState
from gpuops.model.records import decision_doc, decision_from_doc, outcome_doc, outcome_from_doc
from gpuops.store.codecs import alert_doc, alert_from_doc, quota_request_doc, quota_request_from_doc
from gpuops.store.interface import (
    AlertKey,
    Approval,
    ApprovalStatus,
    Audited,
    DecisionStatus,
    InboxItem,
    QuotaRequest,
    QuotaStatus,
    StoredDecision,
)

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
target row's own, they are the target's (``StateStore.policy_state``). PostgreSQL makes the
same table (``gpuops.store.postgres``)."""

MIGRATIONS: tuple[str | tuple[str, ...], ...] = (
    # 1: write-ahead audit. ``audited``: 0 = nothing in the spool yet, 1 = the intent (decision
    # and verdict) is, 2 = its outcome is too. Decisions of older files were audited (after).
    "ALTER TABLE decisions ADD COLUMN audited INTEGER NOT NULL DEFAULT 2",
    # 2: a resolved alert that came before its firing's action succeeded waits for it here
    "CREATE TABLE early_resolves (fire_id TEXT PRIMARY KEY, alert TEXT NOT NULL, at REAL NOT NULL)",
    # 3: one row per (policy, target) instead of one JSON document per policy, so that a cycle
    # writes only the targets that changed (issue 15). Readable rows move; a row that is not a
    # JSON object stays in ``policy_state``, still unreadable (``StateRowError``) until repaired.
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
    # 5: quota requests, in this connection's transactions (older files made the table on a
    # connection of their own, hence IF NOT EXISTS), and its index (6)
    "CREATE TABLE IF NOT EXISTS quota_requests (id TEXT PRIMARY KEY, data TEXT NOT NULL,"
    " status TEXT NOT NULL, requested_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS quota_requests_status ON quota_requests (status)",
    # 7: each policy's latest ``last_seen``/``value`` of all its targets in one row (``_seen``),
    # so a steady cycle rewrites no target row to refresh them (issue 15: refresh bursts)
    SEEN_TABLE,
)
"""Schema changes after ``SCHEMA``, in order (one statement, or several run in one
transaction); a state file records how many it has had."""

INTENT, OUTCOME = Audited.INTENT, Audited.OUTCOME
"""The values of ``decisions.audited`` (see ``MIGRATIONS``)."""

APPLICATION_ID = 0x6770_6F70
"""``PRAGMA application_id`` of a gpuops state file ("gpop"); files made before it have 0."""

_TABLES = frozenset(
    {"policy_state", "guardrails", "decisions", "controls", "approvals", "alert_inbox"}
)
"""Tables of every gpuops state file so far: a file from before ``APPLICATION_ID`` has one."""

_HEADER = b"SQLite format 3\x00"
_HEADER_SIZE = 100
_INTEGRITY_LINES = 3
"""How many lines of ``quick_check``'s complaints an error quotes."""


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


class StateStore:
    """The SQLite store; ``gpuops.store.postgres.PostgresStore`` shares its queries (they are
    written
    in the SQL both dialects speak: ``ON CONFLICT``, ``RETURNING``, ``?`` placeholders) and
    overrides only ``_atomic`` (a transaction) and ``_check_cache``."""

    INSERTION_ORDER = "rowid"
    """The column that orders rows of one ``at`` by insertion (PostgreSQL: a sequence)."""

    def __init__(self, path: Path | str, previous_run: str | None = None) -> None:
        """Open (or create) the state file at ``path``, or raise ``StateError``.

        ``previous_run``: evidence that the engine ran with this file before (e.g. "the audit
        spool var/audit was written before"), or None. With it, a missing file is an error
        (``StateFileMissing``: lost, or its volume not mounted) and so is an empty one (it was
        truncated); without it, either is taken as new (an empty one made by ``touch``)."""
        self.path = Path(path)
        memory = str(path) == ":memory:"
        if not memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _check_file(self.path, previous_run)
        self._lock = threading.RLock()
        self._states: dict[str, PolicyState] = {}  # policy -> its state, as committed
        self._stored: dict[str, _Rows] = {}  # policy -> its targets as its rows hold them
        self._pending: dict[str, tuple[PolicyState, _Rows]] = {}
        self._data_version = -1
        self._guard: GuardrailState | None = None  # the guardrail windows, as committed
        self._guard_pending: GuardrailState | None = None
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            if not memory:
                _check_database(self._db, self.path)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            self._migrate()
            if int(self._db.execute("PRAGMA application_id").fetchone()[0]) != APPLICATION_ID:
                self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateError(f"{self.path}: {_describe(self.path, exc)}") from exc
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        """Bring an older state file to ``MIGRATIONS``' version (``PRAGMA user_version``),
        each step in its own transaction; a newer file's is refused (``StateError``), as
        PostgreSQL's is: an older engine would read stale values (``policy_seen``)."""
        with self._lock:
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > len(MIGRATIONS):  # a newer engine's file (a downgrade)
                raise StateError(
                    f"{self.path}: the state file has schema version {version}, newer than"
                    f" this engine's {len(MIGRATIONS)}: upgrade the engine"
                )
            for number, sql in enumerate(MIGRATIONS[version:], start=version + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in (sql,) if isinstance(sql, str) else sql:
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {number}")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                with self._atomic() as db:
                    self._check_cache()
                    self._pending.clear()
                    self._guard_pending = None
                    yield db
            except BaseException:
                # rolled back, or a COMMIT whose result is unknown (a connection lost while it
                # ran may have committed it): what is cached may no longer be what is stored
                self._pending.clear()
                self._guard_pending = None
                self._forget_cache()
                raise
            for policy, (state, stored) in self._pending.items():
                self._states[policy] = state
                self._stored[policy] = stored
            self._pending.clear()
            if self._guard_pending is not None:
                self._guard, self._guard_pending = self._guard_pending, None

    @contextmanager
    def _atomic(self) -> Iterator[sqlite3.Connection]:
        """One transaction of the backend: committed when the block ends, else rolled back."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_cache(self) -> None:
        """Forget the cached policy states when another connection committed to the file since
        (``PRAGMA data_version`` changes then, and only then): the cache is this process's own
        writes and reads, sound while no one else writes (call with the lock held)."""
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        if version != self._data_version:
            self._data_version = version
            self._forget_cache()

    def _forget_cache(self) -> None:
        """Drop everything cached from the database: the policy states and the guardrail
        windows (each backend's ``_check_cache`` decides when)."""
        self._states.clear()
        self._stored.clear()
        self._guard = None

    # --- policy state -------------------------------------------------------------------
    # One row per (policy, target) in ``policy_targets`` (migration 3); ``policy_state`` keeps
    # only rows of older files that could not be moved (not JSON objects: unreadable). The
    # states this process wrote or read are cached (``_states``, and ``_stored``: each target
    # as its row holds it), so a cycle neither reads nor decodes its policy's rows, and
    # ``save_policy_state`` writes only the targets that changed.

    def policy_state(self, policy: str) -> PolicyState:
        """The stored state of ``policy`` (empty when none), or ``StateRowError`` when one of
        its rows cannot be decoded. A target's ``last_seen`` and ``value`` are its row's, or
        the policy's ``policy_seen`` row's where that is newer (``_seen``)."""
        with self._lock:
            self._check_cache()
            cached = self._states.get(policy)
            if cached is not None:
                return cached
            legacy = self._db.execute(
                "SELECT data FROM policy_state WHERE policy = ?", (policy,)
            ).fetchone()
            rows = self._db.execute(
                "SELECT target, data FROM policy_targets WHERE policy = ?", (policy,)
            ).fetchall()
            seen = self._db.execute(
                "SELECT at, data FROM policy_seen WHERE policy = ?", (policy,)
            ).fetchone()
            where = ""
            try:
                if legacy is not None:
                    raise ValueError(f"not a JSON object: {str(legacy[0])[:80]!r}")
                targets: dict[str, TargetState] = {}
                for key, data in rows:
                    where = f"target {key!r}: "
                    targets[intern(key)] = _target_state_from_dict(json.loads(data))
                stored = dict(targets)
                seen_at = min((t.last_seen for t in targets.values()), default=-inf)
                if seen is not None:
                    where = "its policy_seen row: "
                    seen_at = float(seen[0])
                    _overlay(targets, json.loads(seen[1]))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                detail = f"{where}{type(exc).__name__}: {exc}"
                raise StateRowError(
                    f"{self.path}: policy_state row of {policy!r} cannot be decoded ({detail})",
                    policy,
                ) from exc
            state = PolicyState(freeze(targets))
            self._states[policy] = state
            self._stored[policy] = _Rows(stored, state.base, seen_at)
            return state

    def take_policy_state(self, policy: str, keep: Callable[[str], object]) -> bool:
        """Hand ``policy``'s raw rows to ``keep`` (one JSON object of its targets, as the
        rows hold them, then its ``policy_seen`` row's data, if any), then remove them (not
        when ``keep`` raises); False when there were none. The repair of one bad row
        (``gpuops state reset --policy``)."""
        with self.transaction() as db:
            legacy = db.execute(
                "SELECT data FROM policy_state WHERE policy = ?", (policy,)
            ).fetchone()
            rows = db.execute(
                "SELECT target, data FROM policy_targets WHERE policy = ?", (policy,)
            ).fetchall()
            seen = db.execute("SELECT data FROM policy_seen WHERE policy = ?", (policy,)).fetchone()
            if legacy is None and not rows and seen is None:
                return False
            raw = [str(legacy[0])] if legacy is not None else []
            if rows:
                raw.append("{" + ", ".join(f"{json.dumps(k)}: {d}" for k, d in rows) + "}")
            if seen is not None:
                raw.append(str(seen[0]))
            keep("\n".join(raw))
            db.execute("DELETE FROM policy_state WHERE policy = ?", (policy,))
            db.execute("DELETE FROM policy_targets WHERE policy = ?", (policy,))
            db.execute("DELETE FROM policy_seen WHERE policy = ?", (policy,))
            self._states.pop(policy, None)
            self._stored.pop(policy, None)
        return True

    def policy_names(self) -> list[str]:
        with self._lock:
            return [
                r[0]
                for r in self._db.execute(
                    "SELECT policy FROM policy_state"
                    " UNION SELECT DISTINCT policy FROM policy_targets"
                    " UNION SELECT policy FROM policy_seen"
                )
            ]

    def save_policy_state(self, db: sqlite3.Connection, policy: str, state: PolicyState) -> None:
        """Store ``state`` in the open transaction ``db``: the rows of the targets that changed
        other than in ``last_seen`` and ``value`` (which change at every evaluation), and,
        every ``REFRESH_S`` or less, every target's ``last_seen`` and ``value`` in the
        policy's one ``policy_seen`` row (``_seen``); all rows when this process has not read
        or written the policy's rows since it opened the file (or another process wrote it).
        A state sharing the rows' base (only values seen again moved: ``PolicyState.seen``)
        is not compared target by target."""
        with self._lock:
            pending = self._pending.get(policy)
            known = pending[1] if pending is not None else self._stored.get(policy)
            if known is None:
                db.execute("DELETE FROM policy_state WHERE policy = ?", (policy,))
                db.execute("DELETE FROM policy_targets WHERE policy = ?", (policy,))
                db.execute("DELETE FROM policy_seen WHERE policy = ?", (policy,))
                rows = _Rows({}, None, inf)
            else:
                rows = known.copy()
            parent = state.parent
            if rows.base is not None and state.base is rows.base:
                now = state.seen_at  # only seen values moved: no row to write
            else:
                now = -inf
                writes: list[tuple[str, str, str]] = []
                stored = rows.rows = dict(rows.rows)  # copied on write
                if rows.base is not None and parent is not None and parent.base is rows.base:
                    # the churn path's state: only ``parent.keys`` differ from the rows'
                    # base (the others are its objects, seen again): their rows alone
                    base = state.base
                    if base:
                        now = state.seen_at
                    for key in parent.keys:
                        target = base.get(key)
                        if target is not None:
                            writes.append((policy, key, _target_data(target)))
                            stored[key] = target
                    gone = [(policy, k) for k in parent.keys if k not in base and k in stored]
                else:
                    for key, target in state.targets.items():
                        if target.last_seen > now:
                            now = target.last_seen
                        before = stored.get(key)
                        if before is None or _changed(before, target):
                            writes.append((policy, key, _target_data(target)))
                            stored[key] = target
                    gone = [(policy, key) for key in stored if key not in state.base]
                for _, key in gone:
                    del stored[key]
                rows.base = state.base
                if rows.seen_at == inf and state.base:  # every row written now
                    # (an empty state stays at inf, on every path: review 15b finding 1, the
                    # general path's -inf here made it write a policy_seen row at the refill
                    # that the fast paths did not, and the stores differed after a restart)
                    rows.seen_at = now
                if gone:
                    db.executemany(
                        "DELETE FROM policy_targets WHERE policy = ? AND target = ?", gone
                    )
                if writes:
                    db.executemany(
                        "INSERT INTO policy_targets (policy, target, data) VALUES (?, ?, ?)"
                        " ON CONFLICT (policy, target) DO UPDATE SET data = excluded.data",
                        writes,
                    )
                if not stored and gone:  # the state emptied: no target left to refresh
                    db.execute("DELETE FROM policy_seen WHERE policy = ?", (policy,))
                    rows.seen_at = inf  # the next targets' rows are all written
            if state.base and now - rows.seen_at >= _refresh_after(policy):
                db.execute(
                    "INSERT INTO policy_seen (policy, at, data) VALUES (?, ?, ?)"
                    " ON CONFLICT (policy) DO UPDATE SET at = excluded.at, data = excluded.data",
                    (policy, now, _seen(state)),
                )
                rows.seen_at = now
            self._pending[policy] = (state, rows)

    # --- guardrails ---------------------------------------------------------------------
    def guardrail_state(self) -> GuardrailState:
        """The guardrail windows; cached (the same value until a commit changes them), as the
        gate reads them at every action's execution."""
        with self._lock:
            self._check_cache()
            if self._guard is None:
                row = self._db.execute("SELECT data FROM guardrails WHERE id = 1").fetchone()
                self._guard = self._decode_guardrails(row[0]) if row else GuardrailState()
            return self._guard

    def _decode_guardrails(self, text: str) -> GuardrailState:
        try:
            data = json.loads(text)
            return GuardrailState(
                freeze(data["last_action"]),
                tuple(Execution(e["at"], e["policy"], e["target"]) for e in data["recent"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # engine-wide: without its windows no cooldown would hold, so nothing may act
            raise StateError(
                f"{self.path}: the guardrails row (cooldowns, rate windows) cannot be decoded"
                f" ({type(exc).__name__}: {exc})"
            ) from exc

    def save_guardrail_state(self, db: sqlite3.Connection, state: GuardrailState) -> None:
        data = {
            "last_action": dict(state.last_action),
            "recent": [{"at": e.at, "policy": e.policy, "target": e.target} for e in state.recent],
        }
        db.execute(
            "INSERT INTO guardrails (id, data) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET data = excluded.data",
            (json.dumps(data),),
        )
        self._guard_pending = state

    # --- decisions ----------------------------------------------------------------------
    @staticmethod
    def record_decision(db: sqlite3.Connection, decision: Decision, status: DecisionStatus) -> bool:
        """Insert a decision; False when its id is already known (a replay: do not act again)."""
        cur = db.execute(
            "INSERT INTO decisions (id, policy, target, transition, verdict, at, status,"
            " data, audited) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING",
            _decision_params(decision, status),
        )
        return cur.rowcount == 1

    def record_decisions(
        self, db: sqlite3.Connection, decisions: Sequence[tuple[Decision, DecisionStatus]]
    ) -> set[str]:
        """``record_decision`` of each of ``decisions`` in order, in one statement: the ids it
        inserted (the others are replays, or a repeat of an id before them). The ids known
        are read first (``BEGIN IMMEDIATE`` holds the file's one writer: none can come
        between), the others written with one ``executemany`` (``ON CONFLICT DO NOTHING``
        still) instead of one ``execute`` per decision (issue 15: a stay-churn round records
        a few thousand). On another backend (PostgreSQL: under READ COMMITTED a read first
        would not keep another connection's insert out) one ``record_decision`` each."""
        if not isinstance(db, sqlite3.Connection):
            return {d.id for d, status in decisions if self.record_decision(db, d, status)}
        known: set[str] = set()
        ids = [d.id for d, _ in decisions]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            known.update(
                r[0]
                for r in db.execute(
                    f"SELECT id FROM decisions WHERE id IN ({','.join('?' * len(chunk))})", chunk
                )
            )
        new: set[str] = set()
        rows: list[tuple[Any, ...]] = []
        for decision, status in decisions:
            if decision.id in known or decision.id in new:
                continue
            new.add(decision.id)
            rows.append(_decision_params(decision, status))
        if rows:
            db.executemany(
                "INSERT INTO decisions (id, policy, target, transition, verdict, at, status,"
                " data, audited) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING",
                rows,
            )
        return new

    @staticmethod
    def rerun_decision(db: sqlite3.Connection, decision: Decision) -> None:
        """A stored decision that runs after all (a granted approval): its new verdict, to be
        audited and run by the gate."""
        db.execute(
            "UPDATE decisions SET verdict = ?, data = ?, status = 'started', outcome = NULL,"
            " audited = 0 WHERE id = ?",
            (decision.verdict.value, json.dumps(decision_doc(decision)), decision.id),
        )

    def finish_decision(
        self, decision_id: str, outcome: Outcome, held: Decision | None = None
    ) -> None:
        """Store a decision's outcome (and, when the gate held it, its new verdict)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE decisions SET status = 'done', outcome = ? WHERE id = ?",
                (json.dumps(outcome_doc(outcome)), decision_id),
            )
            if held is not None:
                _set_verdict(db, decision_id, held.verdict.value, held.reason)

    def mark_audited(self, ids: Sequence[str], level: Audited) -> None:
        """Note that the spool holds the intent (``INTENT``) or the outcome (``OUTCOME``)."""
        with self.transaction() as db:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                db.execute(
                    f"UPDATE decisions SET audited = ? WHERE audited < ? AND id IN "
                    f"({','.join('?' * len(chunk))})",
                    (int(level), int(level), *chunk),
                )

    def unaudited_ids(self, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` of ``unaudited``'s decisions, without reading the decisions
        (the gate's admission asks this of every decision it records)."""
        found: set[str] = set()
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                found.update(
                    row[0]
                    for row in self._db.execute(
                        f"SELECT id FROM decisions WHERE {_UNAUDITED}"
                        f" AND id IN ({','.join('?' * len(chunk))})",
                        tuple(chunk),
                    )
                )
        return found

    def unaudited(self, ids: Sequence[str] | None = None) -> list[StoredDecision]:
        """Decisions whose intent, or whose stored outcome, the spool lacks (``ids``: only
        among those), oldest first."""
        where = _UNAUDITED
        rows: list[tuple[Any, ...]] = []
        with self._lock:
            if ids is None:
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM decisions WHERE {where} ORDER BY at"
                ).fetchall()
            else:
                for start in range(0, len(ids), 500):
                    chunk = ids[start : start + 500]
                    rows += self._db.execute(
                        f"SELECT {_COLUMNS} FROM decisions WHERE {where}"
                        f" AND id IN ({','.join('?' * len(chunk))}) ORDER BY at",
                        tuple(chunk),
                    ).fetchall()
        return [self._decision_row(r) for r in rows]

    def mark_retried(self, decision_id: str, now: float) -> bool:
        """Accept an admin's retry of ``decision_id`` once (False: it was retried before)."""
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE decisions SET retried_at = ? WHERE id = ? AND retried_at IS NULL",
                (now, decision_id),
            )
            return cur.rowcount == 1

    def failures_in_episode(self, policy: str, target: str, episode_start: float) -> int:
        """How many actions on ``target`` failed in the episode that began at ``episode_start``
        (the exponent of the backoff before the next try)."""
        with self._lock:  # JSON read here, not in SQL: the same query for every backend
            rows = self._db.execute(
                "SELECT data, outcome FROM decisions WHERE policy = ? AND target = ?"
                " AND status = 'done' AND outcome IS NOT NULL",
                (policy, target),
            ).fetchall()
        return sum(
            1
            for data, outcome in rows
            if json.loads(outcome).get("status") == "failure"
            and json.loads(data).get("episode_start") == episode_start
        )

    def decision(self, decision_id: str) -> StoredDecision | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM decisions WHERE id = ?", (decision_id,)
            ).fetchone()
        return self._decision_row(row) if row else None

    def stored_decisions(self, ids: Sequence[str]) -> dict[str, StoredDecision]:
        """The stored decisions among ``ids``, by id (``decision`` of many, one query per 500:
        the inbox's worker reads those a batch of alerts may repeat or undo)."""
        unique = list(dict.fromkeys(ids))
        rows: list[tuple[Any, ...]] = []
        with self._lock:
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                rows += self._db.execute(
                    f"SELECT {_COLUMNS} FROM decisions WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
        found = (self._decision_row(row) for row in rows)
        return {stored.id: stored for stored in found}

    def prune(self, older_than: float) -> int:
        """Forget finished decisions and settled approvals older than ``older_than`` (the audit
        trail keeps them); returns how many rows went."""
        with self.transaction() as db:
            gone = db.execute(
                "DELETE FROM decisions WHERE at < ? AND status = 'done'", (older_than,)
            ).rowcount
            gone += db.execute(
                "DELETE FROM approvals WHERE requested_at < ? AND status != 'pending'",
                (older_than,),
            ).rowcount
        return gone

    def unfinished(self) -> list[StoredDecision]:
        """Decisions recorded to run, whose intent is audited and whose outcome never came (the
        engine stopped in between). One whose intent is not written yet is not among them:
        only the gate's admission or reconciliation runs it, after writing it."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM decisions WHERE status = 'started' AND audited >= 1"
                " ORDER BY at"
            ).fetchall()
        return [self._decision_row(r) for r in rows]

    def decisions(
        self, policy: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[StoredDecision]:
        sql = f"SELECT {_COLUMNS} FROM decisions WHERE 1=1"
        args: list[Any] = []
        if policy:
            sql += " AND policy = ?"
            args.append(policy)
        if since is not None:
            sql += " AND at >= ?"
            args.append(since)
        sql += f" ORDER BY at DESC, {self.INSERTION_ORDER} DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            return [self._decision_row(r) for r in self._db.execute(sql, args)]

    def _decision_row(self, row: tuple[Any, ...]) -> StoredDecision:
        try:
            data, status, outcome, audited, retried_at = row
            return StoredDecision(
                decision_from_doc(json.loads(data)),
                DecisionStatus(status),
                outcome_from_doc(json.loads(outcome)) if outcome else None,
                Audited(int(audited)),
                retried_at,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise StateError(
                f"{self.path}: a decisions row cannot be decoded ({type(exc).__name__}: {exc};"
                f" it starts {str(row[0])[:80]!r})"
            ) from exc

    # --- controls (kill switch, pause) -----------------------------------------------------
    def control(self, name: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM controls WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def set_control(self, name: str, value: str | None) -> None:
        with self.transaction() as db:
            if value is None:
                db.execute("DELETE FROM controls WHERE name = ?", (name,))
            else:
                db.execute(
                    "INSERT INTO controls VALUES (?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (name, value),
                )

    # --- approvals -----------------------------------------------------------------------
    @staticmethod
    def save_approval(
        db: sqlite3.Connection, decision: Decision, requested_at: float, expires_at: float
    ) -> None:
        db.execute(
            "INSERT INTO approvals (decision_id, policy, target, requested_at,"
            " expires_at, status, data) VALUES (?, ?, ?, ?, ?, 'pending', ?)"
            " ON CONFLICT (decision_id) DO NOTHING",
            (
                decision.id,
                decision.policy,
                decision.target.key,
                requested_at,
                expires_at,
                json.dumps(decision_doc(decision)),
            ),
        )

    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        sql = f"SELECT {_APPROVAL_COLUMNS} FROM approvals"
        args: tuple[Any, ...] = ()
        if status:
            sql += " WHERE status = ?"
            args = (ApprovalStatus(status).value,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY requested_at DESC", args).fetchall()
        return [self._approval_row(r) for r in rows]

    def approval(self, decision_id: str) -> Approval | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE decision_id = ?", (decision_id,)
            ).fetchone()
        return self._approval_row(row) if row else None

    def settle_approval(
        self,
        db: sqlite3.Connection,
        decision_id: str,
        status: ApprovalStatus,
        user: str | None,
        now: float,
    ) -> Approval | None:
        """Move a pending approval to ``status`` inside ``db``; None when it was not pending
        any more."""
        cur = db.execute(
            "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?"
            " WHERE decision_id = ? AND status = 'pending'",
            (status.value, user, now, decision_id),
        )
        if cur.rowcount != 1:
            return None
        row = db.execute(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE decision_id = ?", (decision_id,)
        ).fetchone()
        return self._approval_row(row)

    def expired_approvals(self, now: float) -> list[Approval]:
        return [a for a in self.approvals(ApprovalStatus.PENDING) if a.expires_at <= now]

    def _approval_row(self, row: tuple[Any, ...]) -> Approval:
        requested_at, expires_at, status, decided_by, decided_at, data = row
        try:
            return Approval(
                decision_from_doc(json.loads(data)),
                requested_at,
                expires_at,
                ApprovalStatus(status),
                decided_by,
                decided_at,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise StateError(
                f"{self.path}: an approvals row cannot be decoded ({type(exc).__name__}: {exc})"
            ) from exc

    # --- quota requests ------------------------------------------------------------------
    def add_quota_request(self, request: QuotaRequest) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO quota_requests VALUES (?, ?, ?, ?)",
                (
                    request.id,
                    json.dumps(quota_request_doc(request)),
                    request.status.value,
                    request.requested_at,
                ),
            )

    def quota_request(self, request_id: str) -> QuotaRequest | None:
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM quota_requests WHERE id = ?", (request_id,)
            ).fetchone()
        return self._quota_row(row[0]) if row else None

    def quota_requests(
        self, status: QuotaStatus | None = None, limit: int = 1000
    ) -> list[QuotaRequest]:
        sql, args = (
            "SELECT data FROM quota_requests",
            [] if status is None else [QuotaStatus(status).value],
        )
        if status is not None:
            sql += " WHERE status = ?"
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY requested_at DESC LIMIT ?", [*args, limit])
            return [self._quota_row(r[0]) for r in rows.fetchall()]

    def move_quota_request(self, request: QuotaRequest, expected: QuotaStatus) -> bool:
        """Store ``request`` if the stored one is still in status ``expected`` (compare and set:
        two admins approving at once apply it once)."""
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE quota_requests SET data = ?, status = ? WHERE id = ? AND status = ?",
                (
                    json.dumps(quota_request_doc(request)),
                    request.status.value,
                    request.id,
                    expected.value,
                ),
            )
            return cur.rowcount == 1

    def _quota_row(self, data: str) -> QuotaRequest:
        try:
            return quota_request_from_doc(json.loads(data))
        except (ValueError, TypeError, KeyError) as exc:
            raise StateError(
                f"{self.path}: a quota_requests row cannot be decoded"
                f" ({type(exc).__name__}: {exc}; it starts {data[:80]!r})"
            ) from exc

    # --- Alertmanager episodes -----------------------------------------------------------
    def inbox_add(self, alerts: Sequence[Mapping[str, Any]], now: float) -> list[int]:
        """Keep received alerts on disk until handled (the receiver answers after this)."""
        with self.transaction() as db:
            return [
                int(
                    db.execute(
                        "INSERT INTO alert_inbox (received_at, alert) VALUES (?, ?) RETURNING id",
                        (now, json.dumps(alert_doc(alert))),
                    ).fetchone()[0]
                )
                for alert in alerts
            ]

    def inbox(self) -> list[InboxItem]:
        """Alerts received but not handled yet, oldest first (after a crash: to handle now)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, alert, received_at FROM alert_inbox ORDER BY id"
            ).fetchall()
        return [InboxItem(int(r[0]), alert_from_doc(json.loads(r[1])), float(r[2])) for r in rows]

    def inbox_done(self, item: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM alert_inbox WHERE id = ?", (item,))

    def alerts_handled(self, keys: Sequence[AlertKey], items: Sequence[int], now: float) -> None:
        """Record the episodes ``keys`` and take ``items`` out of the inbox, in one transaction
        (one fsync for a batch of the inbox's worker, not two an alert)."""
        with self.transaction() as db:
            if keys:
                db.executemany(
                    "INSERT INTO alert_episodes VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [(k.fingerprint, k.starts_at, k.status, now) for k in keys],
                )
            if items:
                db.executemany("DELETE FROM alert_inbox WHERE id = ?", [(i,) for i in items])

    def known_alerts(self, keys: Sequence[AlertKey]) -> set[AlertKey]:
        """Those of ``keys`` recorded (``alert_known`` of many, one query per 500
        fingerprints)."""
        wanted = set(keys)
        fingerprints = sorted({k.fingerprint for k in wanted})
        found: set[AlertKey] = set()
        with self._lock:
            for start in range(0, len(fingerprints), 500):
                chunk = fingerprints[start : start + 500]
                rows = self._db.execute(
                    "SELECT fingerprint, starts_at, status FROM alert_episodes"
                    f" WHERE fingerprint IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                found.update(k for r in rows if (k := AlertKey(r[0], r[1], r[2])) in wanted)
        return found

    def alert_known(self, key: AlertKey) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM alert_episodes WHERE fingerprint = ? AND starts_at = ?"
                " AND status = ?",
                (key.fingerprint, key.starts_at, key.status),
            ).fetchone()
        return row is not None

    def prune_alert_episodes(self, older_than: float) -> int:
        """Forget handled alert episodes, and resolves whose fire never came, older than
        ``older_than``; returns how many rows went."""
        with self.transaction() as db:
            gone = db.execute("DELETE FROM alert_episodes WHERE seen_at < ?", (older_than,))
            early = db.execute("DELETE FROM early_resolves WHERE at < ?", (older_than,))
            return int(gone.rowcount) + int(early.rowcount)

    def seen_alert(self, key: AlertKey, now: float) -> bool:
        """Record an alert episode; True when it was already recorded (a retried webhook)."""
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO alert_episodes VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (key.fingerprint, key.starts_at, key.status, now),
            )
            return cur.rowcount == 0

    def forget_alert(self, key: AlertKey) -> None:
        with self.transaction() as db:
            db.execute(
                "DELETE FROM alert_episodes WHERE fingerprint = ? AND starts_at = ? AND status = ?",
                (key.fingerprint, key.starts_at, key.status),
            )

    # --- resolves that came early ---------------------------------------------------------
    def save_early_resolve(self, fire_id: str, alert: Mapping[str, Any], now: float) -> None:
        """Remember a resolved alert whose firing's action (``fire_id``) has not succeeded yet."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO early_resolves VALUES (?, ?, ?)"
                " ON CONFLICT (fire_id) DO UPDATE SET alert = excluded.alert, at = excluded.at",
                (fire_id, json.dumps(alert_doc(alert)), now),
            )

    def take_early_resolve(self, fire_id: str) -> Mapping[str, Any] | None:
        """The resolved alert waiting for ``fire_id`` (removed: it is handled once)."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT alert FROM early_resolves WHERE fire_id = ?", (fire_id,)
            ).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM early_resolves WHERE fire_id = ?", (fire_id,))
        return alert_from_doc(json.loads(row[0]))


def _set_verdict(db: Any, decision_id: str, verdict: str, reason: str | None) -> None:
    """Set a stored decision's verdict and reason, in its columns and its JSON document,
    inside the caller's transaction (read, change, write: no JSON functions of one SQL
    dialect)."""
    row = db.execute("SELECT data FROM decisions WHERE id = ?", (decision_id,)).fetchone()
    if row is None:
        return
    data = json.loads(row[0])
    data["verdict"] = verdict
    data["reason"] = reason
    db.execute(
        "UPDATE decisions SET verdict = ?, data = ? WHERE id = ?",
        (verdict, json.dumps(data), decision_id),
    )


_COLUMNS = "data, status, outcome, audited, retried_at"
"""The columns of a decisions row that make a ``StoredDecision``."""
_APPROVAL_COLUMNS = "requested_at, expires_at, status, decided_by, decided_at, data"


def _check_file(path: Path, previous_run: str | None) -> None:
    """Refuse, before SQLite opens it, a file that is not a state file: missing or empty
    although the engine ran before, or without the SQLite header."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if previous_run is not None:  # lost, or not mounted: starting afresh would re-fire
            raise StateFileMissing(
                f"{path}: the state file does not exist but {previous_run}: is the volume that"
                " holds it mounted, and is state_file right? Starting afresh would forget"
                " cooldowns, firing targets and pending approvals and re-fire what already ran."
                " Put the file back (mount its volume) and start again, or, to start afresh on"
                " purpose, run `gpuops state reset`"
            ) from None
        return
    if size == 0:
        if previous_run is not None:
            raise StateError(
                f"{path}: the state file is empty (0 bytes) but {previous_run}: it was truncated"
                " or replaced"
            )
        return
    with path.open("rb") as fh:
        head = fh.read(_HEADER_SIZE)
    if not head.startswith(_HEADER):
        raise StateError(
            f"{path}: not a gpuops state database (no SQLite header: starts with {head[:16]!r})"
        )
    if len(head) < _HEADER_SIZE:
        raise StateError(
            f"{path}: not a gpuops state database (truncated: {size} bytes, shorter than the"
            f" {_HEADER_SIZE}-byte SQLite header)"
        )


def _check_database(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a foreign SQLite database (another application's id, or none of our tables)
    and one that fails ``PRAGMA quick_check``."""
    app_id = int(db.execute("PRAGMA application_id").fetchone()[0])
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables and not tables & _TABLES):
        found = f"application_id {app_id:#x}" if app_id else f"tables {', '.join(sorted(tables))}"
        raise StateError(f"{path}: not a gpuops state database (an SQLite database with {found})")
    problems = [str(r[0]) for r in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        shown = "; ".join(problems[:_INTEGRITY_LINES])
        more = len(problems) - _INTEGRITY_LINES
        shown += f"; and {more} more" if more > 0 else ""
        raise StateError(f"{path}: corrupt state database (quick_check: {shown}){_size_note(path)}")


def _describe(path: Path, exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "not a database" in text:
        return f"not a gpuops state database ({text})"
    return f"corrupt state database ({text}){_size_note(path)}"


def _size_note(path: Path) -> str:
    """ ", truncated: …" when the file is shorter than its header says."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEADER_SIZE)
        size = path.stat().st_size
    except OSError:
        return ""
    if len(head) < _HEADER_SIZE:
        return ""
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    expected = page_size * pages
    if 0 < size < expected:
        return f", truncated: {size} bytes of the {expected} its header says"
    return ""


def reset(path: Path, now: float | None = None) -> Path | None:
    """Put the state file at ``path`` (and its ``-wal``/``-shm`` files) aside as
    ``NAME.broken-YYYYmmddTHHMMSSZ`` and return the new name (None when there was no file). The
    next open starts afresh. The caller audits it; the engine must not be running."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    aside = path.with_name(f"{path.name}.broken-{stamp}")
    if not path.exists():
        return None
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            os.replace(extra, aside.with_name(aside.name + suffix))
    os.replace(path, aside)
    return aside


REFRESH_S = 300.0
"""A target whose only change is ``last_seen`` and ``value`` (every evaluation of a pending or
firing target) has them stored at most this much later: after a restart the engine knows
each target's ``last_seen`` and ``value`` as they were at most this long before (the
evidence of a clear of a target that left the result); nothing the state machine decides
reads ``last_seen``. That is a bound on how far the store lags, not on the age of a stored
``last_seen``: a firing target kept while absent (hysteresis) and seen again since the last
refresh has the ``last_seen`` of before its absence stored until the next one (review 15b,
finding 1). They are not written into the target's row but, for all the policy's targets
at once, into its one ``policy_seen`` row (``_seen``)."""


_MOVING = frozenset({"last_seen", "value"})


def _refresh_after(policy: str) -> float:
    """How far the evaluation time moves before ``policy``'s ``policy_seen`` row is written
    again: between half of ``REFRESH_S`` and all of it, by the policy's name, so that the
    policies that fired together are not all refreshed in one round."""
    return REFRESH_S * (0.5 + zlib.crc32(policy.encode()) % 16 / 32)


@dataclass
class _Rows:
    """A policy's targets as its rows hold them (``rows``); ``base``: a ``PolicyState.base``
    whose targets equal the rows but for ``last_seen`` and ``value`` (a state sharing it
    changed nothing else); ``seen_at``: when every target's ``last_seen`` and ``value`` were
    last stored (its rows all written, or the ``policy_seen`` row; inf: not yet)."""

    rows: dict[str, TargetState]
    base: Mapping[str, TargetState] | None
    seen_at: float

    def copy(self) -> _Rows:
        """A copy to change in a transaction (the cached one stays as committed; ``rows`` is
        copied only when it changes)."""
        return _Rows(self.rows, self.base, self.seen_at)


def _seen(state: PolicyState) -> str:
    """The ``policy_seen`` data of ``state``: its keys, their ``last_seen``s (one number when
    they are all the same: a state seen again, ``PolicyState.seen``, whose lists are made in
    C) and values (as ``json.dumps`` writes floats: exact, ``NaN`` and ``Infinity``
    included)."""
    if state.seen:  # every target seen at ``seen_at``: one time for all
        return json.dumps([list(state.base), state.seen_at, list(state.seen)])
    targets = state.targets
    return json.dumps(
        [
            list(targets),
            [t.last_seen for t in targets.values()],
            [t.value for t in targets.values()],
        ]
    )


def _overlay(targets: dict[str, TargetState], data: Any) -> None:
    """Set the ``last_seen`` and ``value`` of ``targets`` from a ``policy_seen`` row's data
    where it is newer than the row's own (a row written later has its own, newer ones).
    ``ValueError`` or ``TypeError`` when the data is not what ``_seen`` writes."""
    if not isinstance(data, list) or len(data) != 3:
        raise ValueError(f"not [keys, last_seen, values]: {str(data)[:80]!r}")
    keys, times, values = data
    if type(times) in (float, int):  # one time for all (``_seen`` of a state seen again)
        times = [times] * len(keys) if isinstance(keys, list) else times
    if not (isinstance(keys, list) and isinstance(times, list) and isinstance(values, list)):
        raise ValueError("not [keys, last_seen, values] lists")
    if not len(keys) == len(times) == len(values):
        raise ValueError(f"lists of {len(keys)}, {len(times)} and {len(values)} items")
    for key, at, value in zip(keys, times, values, strict=True):
        if type(key) is not str or type(at) not in (float, int):
            raise TypeError(f"target {key!r:.80}: not a key and a time")
        if value is not None and type(value) not in (float, int):
            raise TypeError(f"target {key!r:.80}: value {value!r:.40} is not a number")
        target = targets.get(key)
        if target is not None and at > target.last_seen:
            targets[key] = replace(target, last_seen=float(at), value=value)


def _changed(before: TargetState, after: TargetState) -> bool:
    """Whether ``after``'s row must be written over ``before``'s: a field other than
    ``last_seen`` and ``value`` (``_MOVING``: stored in ``policy_seen``) differs. This runs
    for every target of an evaluation that did not take the steady path."""
    if after is before:
        return False
    old, new = vars(before), dict(vars(after))
    new["last_seen"], new["value"] = old["last_seen"], old["value"]  # ``_MOVING``
    return new != old  # compared in C, identical field values first


_UNAUDITED = "(audited = 0 OR (outcome IS NOT NULL AND audited < 2))"
"""The decisions whose intent, or whose stored outcome, the spool lacks."""


def _target_state_to_dict(t: TargetState) -> dict[str, Any]:
    return {
        "status": t.status.value,
        "active_since": t.active_since,
        "last_seen": t.last_seen,
        "value": t.value,
        "labels": dict(t.labels),
        "fired_at": t.fired_at,
        "last_fire_at": t.last_fire_at,
        "repeats": t.repeats,
        "absent_since": t.absent_since,
        "actions": t.actions,
        "retry_at": t.retry_at,
        "held": t.held,
        "held_since": t.held_since,
        "held_repeats": t.held_repeats,
    }


def _interned(labels: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``freeze(labels)`` with its string values interned (``Target.from_labels``)."""
    frozen = freeze(labels)
    return freeze({k: intern(v) if type(v) is str else v for k, v in frozen.items()})


def _target_state_from_dict(t: Mapping[str, Any]) -> TargetState:
    return TargetState(
        status=Status(t["status"]),
        active_since=t["active_since"],
        last_seen=t["last_seen"],
        value=t["value"],
        labels=_interned(t["labels"]),
        fired_at=t["fired_at"],
        last_fire_at=t["last_fire_at"],
        repeats=t["repeats"],
        absent_since=t.get("absent_since"),
        actions=int(t.get("actions", 0)),
        retry_at=t.get("retry_at"),
        held=t.get("held"),
        held_since=t.get("held_since"),
        held_repeats=int(t.get("held_repeats", 0)),
    )


def _exact(value: Any) -> bool:
    """Whether orjson writes ``value`` so that ``json.loads`` reads back what it reads back
    from ``json.dumps``: only JSON's own types (orjson also writes dates, datetimes, UUIDs and
    enums, which ``json.dumps`` refuses: those take ``json.dumps``, which raises as it always
    did, so such a decision is not recorded and does not run), and no NaN or Infinity (orjson
    writes them as ``null``)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return bool(value - value == 0.0)  # False for NaN and the infinities
    if isinstance(value, Mapping):
        return all(_exact(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_exact(v) for v in value)
    return False


def _finite(*values: float | None) -> bool:
    """Whether none of ``values`` (numbers or None) is NaN or an infinity."""
    for v in values:  # a loop, not ``all`` over a generator: ~3x cheaper
        if v is not None and v - v != 0.0:
            return False
    return True


def _mapping(value: Any) -> Any:
    """orjson's ``default``: the read-only mappings (``freeze``) of the documents."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(type(value).__name__)


def _target_data(t: TargetState) -> str:
    """The ``policy_targets`` data of ``t``: the values of ``_target_state_to_dict`` (orjson
    writes a dataclass' fields in their order: the same keys in the same order; a test checks
    it), written by orjson (C, compact, UTF-8: ~3x cheaper than ``json.dumps`` of the dict,
    paid by every changed target of a round) and read back by ``json.loads`` to the same
    values. ``json.dumps`` where orjson would not write the same values (NaN, Infinity: it
    writes ``null``) or refuses (a lone surrogate, an integer beyond 64 bits)."""
    if _finite(
        t.value,
        t.active_since,
        t.last_seen,
        t.fired_at,
        t.last_fire_at,
        t.absent_since,
        t.retry_at,
        t.held_since,
    ):
        try:
            return orjson.dumps(t, default=_mapping).decode()
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(_target_state_to_dict(t))


def _decision_data(decision: Decision) -> str:
    """The ``decisions`` data of ``decision`` (``decision_doc``), written as ``_target_data``
    writes a target's: orjson where it writes the same values, else ``json.dumps``."""
    doc = decision_doc(decision)
    ev = decision.evidence
    action = doc["action"]
    if _finite(
        ev.value, ev.pending_since, ev.observed_at, decision.at, decision.episode_start
    ) and (action is None or _exact(action["params"])):
        try:
            return orjson.dumps(doc, default=_mapping).decode()
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(doc)


def _decision_params(decision: Decision, status: DecisionStatus) -> tuple[Any, ...]:
    """The values of a new ``decisions`` row (``record_decision``, ``record_decisions``)."""
    return (
        decision.id,
        decision.policy,
        decision.target.key,
        decision.transition.value,
        decision.verdict.value,
        decision.at,
        status.value,
        _decision_data(decision),
    )
