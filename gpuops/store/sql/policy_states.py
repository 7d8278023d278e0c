"""The policy states' repository: one row per (policy, target) in ``policy_targets``, the
``last_seen`` and ``value`` of all of a policy's targets in its ``policy_seen`` row
(``gpuops.store.sql.policy_seen``). The states this process wrote or read are cached, so an
evaluation neither reads nor decodes its policy's rows, and ``save_policy_state`` writes only
the targets that changed. ``policy_state`` keeps only rows of files older than
``policy_targets`` that could not be moved into it (not JSON objects: unreadable until
repaired).

Part of ``gpuops.store.sql.store.SqlStore``; ``gpuops.runtime`` reads a policy's state at each
evaluation and saves it in the cycle's transaction; ``gpuops state reset --policy`` takes a
broken one aside.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from math import inf
from pathlib import Path
from sys import intern

from gpuops.model.decisions import freeze
from gpuops.model.evaluation.state import PolicyState, TargetState
from gpuops.store.codecs import target_state_from_doc
from gpuops.store.errors import StateRowError
from gpuops.store.sql.base import Connection, SqlBase
from gpuops.store.sql.columns import target_data
from gpuops.store.sql.policy_seen import (
    TargetRows,
    changed,
    overlay,
    refresh_after,
    seen_data,
)


class SqlPolicyStates(SqlBase):
    """``gpuops.store.interface.PolicyStateRepository`` in SQL, with its cache: ``_states``
    (each policy's state as committed), ``_stored`` (its targets as its rows hold them) and
    ``_pending`` (both, as the open transaction writes them)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._states: dict[str, PolicyState] = {}
        self._stored: dict[str, TargetRows] = {}
        self._pending: dict[str, tuple[PolicyState, TargetRows]] = {}

    def _discard_pending(self) -> None:
        self._pending.clear()
        super()._discard_pending()

    def _commit_pending(self) -> None:
        for policy, (state, stored) in self._pending.items():
            self._states[policy] = state
            self._stored[policy] = stored
        self._pending.clear()
        super()._commit_pending()

    def _forget_cache(self) -> None:
        self._states.clear()
        self._stored.clear()
        super()._forget_cache()

    def policy_state(self, policy: str) -> PolicyState:
        """The stored state of ``policy`` (empty when none), or ``StateRowError`` when one of
        its rows cannot be decoded. A target's ``last_seen`` and ``value`` are its row's, or
        the policy's ``policy_seen`` row's where that is newer (``seen_data``)."""
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
                    targets[intern(key)] = target_state_from_doc(json.loads(data))
                stored = dict(targets)
                seen_at = min((t.last_seen for t in targets.values()), default=-inf)
                if seen is not None:
                    where = "its policy_seen row: "
                    seen_at = float(seen[0])
                    overlay(targets, seen[1])
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                detail = f"{where}{type(exc).__name__}: {exc}"
                raise StateRowError(
                    f"{self.path}: policy_state row of {policy!r} cannot be decoded ({detail})",
                    policy,
                ) from exc
            state = PolicyState(freeze(targets))
            self._states[policy] = state
            self._stored[policy] = TargetRows(stored, state.base, seen_at)
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

    def save_policy_state(self, db: Connection, policy: str, state: PolicyState) -> None:
        """Store ``state`` in the open transaction ``db``: the rows of the targets that changed
        other than in ``last_seen`` and ``value`` (which change at every evaluation), and,
        every ``REFRESH_S`` or less, every target's ``last_seen`` and ``value`` in the
        policy's one ``policy_seen`` row (``seen_data``); all rows when this process has not read
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
                rows = TargetRows({}, None, inf)
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
                            writes.append((policy, key, target_data(target)))
                            stored[key] = target
                    gone = [(policy, k) for k in parent.keys if k not in base and k in stored]
                else:
                    for key, target in state.targets.items():
                        if target.last_seen > now:
                            now = target.last_seen
                        before = stored.get(key)
                        if before is None or changed(before, target):
                            writes.append((policy, key, target_data(target)))
                            stored[key] = target
                    gone = [(policy, key) for key in stored if key not in state.base]
                for _, key in gone:
                    del stored[key]
                rows.base = state.base
                if rows.seen_at == inf and state.base:  # every row written now
                    # (an empty state stays at inf on every path: the general path's -inf
                    # would write a policy_seen row at the refill that the other paths do
                    # not, and the stores would differ after a restart)
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
            if state.base and now - rows.seen_at >= refresh_after(policy):
                db.execute(
                    "INSERT INTO policy_seen (policy, at, data) VALUES (?, ?, ?)"
                    " ON CONFLICT (policy) DO UPDATE SET at = excluded.at, data = excluded.data",
                    (policy, now, seen_data(state)),
                )
                rows.seen_at = now
            self._pending[policy] = (state, rows)
