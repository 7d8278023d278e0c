"""Policy state stored one row per target: an older file's rows move by migration
(an unreadable one stays unreadable), a save writes only the targets that changed, and the
cached state is dropped when another connection writes the file."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from gpuops.model.decisions import freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.guardrails import GuardrailState
from gpuops.store.errors import StateError, StateRowError
from gpuops.store.sql.policy_seen import REFRESH_S
from gpuops.store.sqlite import StateStore
from gpuops.store.sqlite.schema import MIGRATIONS


def target(uuid: str, since: float = 1.0, status: Status = Status.PENDING) -> TargetState:
    return TargetState(status, since, since, 0.1, freeze({"uuid": uuid}))


def state(*targets: tuple[str, TargetState]) -> PolicyState:
    return PolicyState(freeze(dict(targets)))


def saved(store: StateStore, policy: str, value: PolicyState) -> int:
    """Save ``value``; the number of rows the transaction changed."""
    with store.transaction() as db:
        before = db.total_changes
        store.save_policy_state(db, policy, value)
        return db.total_changes - before


def test_an_older_files_rows_move_and_an_unreadable_one_stays_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    old = {"uuid=a": {"status": "firing", "active_since": 1.0, "last_seen": 2.0, "value": 0.5}}
    old["uuid=a"] |= {"labels": {"uuid": "a"}, "fired_at": 1.5, "last_fire_at": 1.5}
    old["uuid=a"] |= {"repeats": 0}
    StateStore(path).close()  # the current schema, then made to look like version 2
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE policy_targets")
        db.execute("ALTER TABLE decisions DROP COLUMN retried_at")  # migration 4
        db.execute("PRAGMA user_version = 2")
        db.execute("INSERT INTO policy_state VALUES ('good', ?)", (json.dumps(old),))
        db.execute("INSERT INTO policy_state VALUES ('bad', '{\"uuid=a\": {')")
    store = StateStore(path)
    try:
        (good,) = store.policy_state("good").targets.values()
        assert (good.status, good.active_since, good.value) == (Status.FIRING, 1.0, 0.5)
        with pytest.raises(StateRowError) as caught:
            store.policy_state("bad")
        assert str(caught.value).startswith(f"{path}: policy_state row of 'bad' cannot be")
        assert sorted(store.policy_names()) == ["bad", "good"]
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT policy FROM policy_state").fetchall() == [("bad",)]
        assert db.execute("SELECT policy, target FROM policy_targets").fetchall() == [
            ("good", "uuid=a")
        ]


def test_a_save_writes_only_the_targets_that_changed(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    try:
        many = [(f"uuid={i}", target(str(i))) for i in range(100)]
        assert saved(store, "p", state(*many)) == 100
        # every evaluation moves last_seen and value: not a change worth a write ...
        seen = [(k, replace(t, last_seen=t.last_seen + 30, value=0.2)) for k, t in many]
        assert saved(store, "p", state(*seen)) == 0
        assert store.policy_state("p") == state(*seen)  # ... the engine still sees them
        # one target fires, one leaves, one is new
        changed = [
            (k, replace(t, status=Status.FIRING)) if k == "uuid=0" else (k, t) for k, t in seen
        ]
        changed = changed[:-1] + [("uuid=new", target("new"))]
        assert saved(store, "p", state(*changed)) == 3
        # last_seen far enough ahead: stored, so a restart knows a recent value, in one
        # row for all the targets (policy_seen), not one per target
        later = [(k, replace(t, last_seen=t.last_seen + REFRESH_S, value=0.3)) for k, t in changed]
        assert saved(store, "p", state(*later)) == 1
    finally:
        store.close()
    reopened = StateStore(tmp_path / "state.sqlite")
    try:
        assert reopened.policy_state("p") == state(*later)
    finally:
        reopened.close()


def test_refreshes_are_one_row_per_policy_spread_over_half_of_refresh_s_to_all_of_it(
    tmp_path: Path,
) -> None:
    """The targets of one episode, written in one evaluation, are not all rewritten (json and
    an upsert per row) REFRESH_S later: a refresh is one row per policy (``policy_seen``: every
    target's last_seen and value), each policy at its own point between half of REFRESH_S and
    REFRESH_S, so that policies that fired together are not refreshed together, and no value
    a restart knows is older than REFRESH_S."""
    policies = [f"policy-{i}" for i in range(40)]
    many = [(f"uuid={i}", target(str(i))) for i in range(50)]
    store = StateStore(tmp_path / "state.sqlite")

    def moved(by: float) -> PolicyState:
        return state(*[(k, replace(t, last_seen=t.last_seen + by, value=by)) for k, t in many])

    def save_all(value: PolicyState) -> int:
        with store.transaction() as db:
            before = db.total_changes
            for name in policies:
                store.save_policy_state(db, name, value)
            return db.total_changes - before

    try:
        assert save_all(state(*many)) == 40 * 50
        assert save_all(moved(REFRESH_S * 0.49)) == 0
        spread = save_all(moved(REFRESH_S * 0.75))
        assert 4 < spread < 36  # some policies, one row each
        assert save_all(moved(REFRESH_S)) == 40 - spread  # the rest, none twice
        stored = StateStore(tmp_path / "state.sqlite")
        try:
            for name in policies:
                targets = stored.policy_state(name).targets.values()
                assert len(targets) == 50
                oldest = min(t.last_seen for t in targets)
                assert oldest >= many[0][1].last_seen + REFRESH_S * 0.75
                assert {t.value for t in targets} <= {REFRESH_S * 0.75, REFRESH_S}
        finally:
            stored.close()
    finally:
        store.close()


def test_a_row_written_after_the_policy_seen_row_keeps_its_own_values(tmp_path: Path) -> None:
    """A target whose row is newer than the policy's ``policy_seen`` row (it changed since,
    or its episode began since) is read as its row holds it; the others get their
    last_seen and value from ``policy_seen``."""
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    try:
        a, b = target("a"), target("b")
        saved(store, "p", state(("a", a), ("b", b)))
        seen = state(
            ("a", replace(a, last_seen=1 + REFRESH_S, value=0.5)),
            ("b", replace(b, last_seen=1 + REFRESH_S, value=0.6)),
        )
        assert saved(store, "p", seen) == 1  # the policy_seen row only
        fired = replace(b, status=Status.FIRING, fired_at=400.0, last_seen=400.0, value=0.7)
        final = state(("a", replace(a, last_seen=400.0, value=0.8)), ("b", fired))
        assert saved(store, "p", final) == 1  # b's row; a's value moved only
    finally:
        store.close()
    reopened = StateStore(path)
    try:
        targets = reopened.policy_state("p").targets
        assert targets["b"] == fired
        assert (targets["a"].last_seen, targets["a"].value) == (1 + REFRESH_S, 0.5)
    finally:
        reopened.close()


def test_an_unreadable_policy_seen_row_fails_only_its_policy(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    try:
        for name in ("p", "q"):
            saved(store, name, state(("a", target("a"))))
            saved(store, name, state(("a", replace(target("a"), last_seen=1 + REFRESH_S))))
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        db.execute("""UPDATE policy_seen SET data = '[["a"], [2.0], ["x"]]' WHERE policy = 'p'""")
    reopened = StateStore(path)
    try:
        with pytest.raises(StateRowError) as caught:
            reopened.policy_state("p")
        assert str(caught.value) == (
            f"{path}: policy_state row of 'p' cannot be decoded (its policy_seen row:"
            " TypeError: target 'a': value 'x' is not a number)"
        )
        assert reopened.policy_state("q").targets["a"].last_seen == 1 + REFRESH_S
    finally:
        reopened.close()


def test_a_policy_seen_row_goes_when_the_state_empties_and_is_named(tmp_path: Path) -> None:
    """The ``policy_seen`` row of a policy whose targets all left is deleted with them (kept,
    it would be unseen by ``policy_names``, so by ``gpuops state check``), and a row left by
    an older engine is named."""
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    try:
        saved(store, "p", state(("a", target("a"))))
        saved(store, "p", state(("a", replace(target("a"), last_seen=1 + REFRESH_S))))
        assert saved(store, "p", state()) == 2  # the target row and the policy_seen row
        assert store.policy_names() == []
        saved(store, "p", state(("b", target("b", since=2 * REFRESH_S))))
        assert list(store.policy_state("p").targets) == ["b"]
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT policy FROM policy_seen").fetchall() == []
        db.execute("DELETE FROM policy_targets")
        db.execute("INSERT INTO policy_seen VALUES ('orphan', 1.0, 'garbage')")
    reopened = StateStore(path)
    try:
        assert reopened.policy_names() == ["orphan"]
        with pytest.raises(StateRowError, match="'orphan'.*its policy_seen row"):
            reopened.policy_state("orphan")
    finally:
        reopened.close()


def test_a_state_file_of_a_newer_engine_is_refused(tmp_path: Path) -> None:
    """An older engine ignores ``policy_seen`` and would read hours-old values; as on
    PostgreSQL, a schema version newer than this engine's is refused."""
    path = tmp_path / "state.sqlite"
    StateStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StateError) as caught:
        StateStore(path)
    assert str(caught.value) == (
        f"{path}: the state file has schema version {len(MIGRATIONS) + 1}, newer than this"
        f" engine's {len(MIGRATIONS)}: upgrade the engine"
    )
    with sqlite3.connect(path) as db:  # left as it was
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) + 1


def test_a_rolled_back_save_is_not_cached(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    try:
        saved(store, "p", state(("uuid=a", target("a"))))
        with pytest.raises(RuntimeError), store.transaction() as db:
            store.save_policy_state(db, "p", state())
            raise RuntimeError("the cycle failed after saving")
        assert list(store.policy_state("p").targets) == ["uuid=a"]
        assert saved(store, "p", state()) == 1  # the row is still there to delete
    finally:
        store.close()


def test_a_write_by_another_connection_drops_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    try:
        saved(store, "p", state(("uuid=a", target("a"))))
        assert list(store.policy_state("p").targets) == ["uuid=a"]
        with sqlite3.connect(path) as db:
            db.execute("UPDATE policy_targets SET data = '{' WHERE policy = 'p'")
        with pytest.raises(StateRowError) as caught:
            store.policy_state("p")
        assert "target 'uuid=a': JSONDecodeError" in str(caught.value)
    finally:
        store.close()


def test_a_commit_that_raised_leaves_nothing_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A COMMIT whose result is unknown (it raised after it landed, as a lost connection can)
    must not leave the cache saying otherwise: the guardrail windows and policy states are
    read again from what is stored."""
    store = StateStore(tmp_path / "state.db")
    saved(store, "p", state(("a", target("a"))))
    assert store.guardrail_state() == GuardrailState()
    atomic = store._atomic

    @contextmanager
    def landed_then_raised() -> Iterator[sqlite3.Connection]:
        with atomic() as db:
            yield db
        raise sqlite3.OperationalError("disk I/O error (after the commit landed)")

    monkeypatch.setattr(store, "_atomic", landed_then_raised)
    windows = GuardrailState(freeze({"p|a": 123.0}), ())
    with pytest.raises(sqlite3.OperationalError), store.transaction() as db:
        store.save_guardrail_state(db, windows)
        store.save_policy_state(db, "p", state(("a", target("a")), ("b", target("b"))))
    monkeypatch.setattr(store, "_atomic", atomic)
    assert store.guardrail_state() == windows
    assert set(store.policy_state("p").targets) == {"a", "b"}
    store.close()


def test_an_emptied_state_refilled_stores_the_same_whichever_path_saved_it(
    tmp_path: Path,
) -> None:
    """A state that emptied, was saved again empty (sharing its base, as the steady path saves
    it, or not, as the general path does), then refilled, leaves the same rows and
    ``policy_seen`` row either way, so that the stores are the same after a restart."""
    stored = []
    for shared in (True, False):
        path = tmp_path / f"{shared}.sqlite"
        store = StateStore(path)
        try:
            saved(store, "p", state(("uuid=a", target("a", 1.0))))
            empty = state()
            saved(store, "p", empty)
            saved(
                store, "p", PolicyState(empty.base, seen=[], seen_at=500.0) if shared else state()
            )
            saved(store, "p", state(("uuid=b", target("b", 645.0))))
        finally:
            store.close()
        with sqlite3.connect(path) as db:
            stored.append(
                (
                    db.execute(
                        "SELECT target, data FROM policy_targets ORDER BY target"
                    ).fetchall(),
                    db.execute("SELECT at, data FROM policy_seen").fetchall(),
                )
            )
    assert stored[0] == stored[1]
    assert [key for key, _ in stored[0][0]] == ["uuid=b"]
