"""The PostgreSQL state store against a real PostgreSQL (docs/ha.md): the same behaviour as the
SQLite store for the rows a takeover needs, every write fenced by the lease epoch, migrations
once for replicas starting together, and passwords from a file or the environment that no
message shows. One cluster for the module."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.health.events import EventKind, HealthEvent
from gpuops.store.errors import DatabaseUnavailable, FencedError, StateError
from gpuops.store.interface import (
    AlertKey,
    ApprovalStatus,
    Audited,
    DecisionStatus,
    QuotaRequest,
    QuotaStatus,
)
from gpuops.store.lease import Lease
from gpuops.store.postgres import PostgresStore
from gpuops.store.postgres.connection import Credentials, redacted
from gpuops.store.postgres.schema import MIGRATIONS
from gpuops.store.sql.policy_seen import REFRESH_S
from gpuops.store.sqlite import StateStore
from tests.postgres import PASSWORD, PostgresServer
from tests.unit.audit.factories import make_decision
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


_count = iter(range(1_000_000))


@pytest.fixture
def url(pg: PostgresServer) -> str:
    return pg.database(f"store_{next(_count)}")


@pytest.fixture
def credentials(pg: PostgresServer) -> Credentials:
    return Credentials(password_file=pg.password_file)


def _leader(url: str, credentials: Credentials, name: str) -> tuple[PostgresStore, Lease]:
    store = PostgresStore(url, credentials, name)
    lease = Lease(url, credentials, name, f"http://{name}:9843")
    epoch = lease.acquire(30)
    assert epoch is not None
    store.fence = lambda: (name, epoch)
    return store, lease


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        sqlite = StateStore(tmp_path / "state.sqlite")
        yield sqlite
        sqlite.close()
        return
    url = request.getfixturevalue("url")
    postgres, lease = _leader(url, request.getfixturevalue("credentials"), "a")
    yield postgres
    postgres.close()
    lease.close()


def _decision(at: float, verdict: str = "execute", episode: float = 1.0) -> Decision:
    decision = make_decision(verdict=verdict, at=at, episode=episode)
    return replace(decision, id=f"{decision.id}-{at:g}")  # one id per time: several per test


def test_decisions_replays_outcomes_and_backoff_count_alike(store: Any) -> None:
    d1, d2 = _decision(2.0), _decision(2.0, episode=1.0)
    d2 = replace(d2, id=d2.id + "b")
    with store.transaction() as db:
        assert store.record_decision(db, d1, DecisionStatus.STARTED)
        assert store.record_decision(db, d2, DecisionStatus.STARTED)
        assert not store.record_decision(db, d1, DecisionStatus.STARTED), "a replay"
    assert store.unaudited_ids([d1.id, "other", d2.id]) == {d1.id, d2.id}, "no intent yet"
    store.mark_audited([d1.id, d2.id], Audited.INTENT)
    assert store.unaudited_ids([d1.id, d2.id]) == set()
    assert [d.id for d in store.unfinished()] == [d1.id, d2.id]
    failure = Outcome(OutcomeStatus.FAILURE, attempts=1, error="boom")
    store.finish_decision(d1.id, failure, d1.with_verdict("suppressed:paused", "held"))
    store.finish_decision(d2.id, failure)
    assert store.unfinished() == []
    held = store.decision(d1.id)
    assert held is not None and held.status is DecisionStatus.DONE
    assert (held.decision.verdict, held.decision.reason) == ("suppressed:paused", "held")
    assert held.outcome is not None and held.outcome.error == "boom"
    target = d1.target.key
    assert store.failures_in_episode(d1.policy, target, 1.0) == 2
    assert store.failures_in_episode(d1.policy, target, 9.0) == 0
    assert [d.id for d in store.decisions()] == [d2.id, d1.id], "newest first, then insertion"
    assert {d.id: d.audited for d in store.unaudited()} == {
        d1.id: Audited.INTENT,
        d2.id: Audited.INTENT,
    }, "their outcomes are not in the spool yet"
    assert store.unaudited_ids([d2.id]) == {d2.id}
    assert store.mark_retried(d2.id, 5.0) and not store.mark_retried(d2.id, 6.0)


def test_policy_targets_approvals_quota_inbox_and_controls_alike(store: Any) -> None:
    state = PolicyState(
        freeze({"pool=a": TargetState(Status.FIRING, 1.0, 2.0, 0.5, freeze({"pool": "a"}))})
    )
    waiting = _decision(3.0, verdict="awaiting_approval")
    with store.transaction() as db:
        store.save_policy_state(db, "p", state)
        store.record_decision(db, waiting, DecisionStatus.DONE)
        store.save_approval(db, waiting, 3.0, 10.0)
    assert store.policy_state("p").targets["pool=a"].status is Status.FIRING
    assert store.policy_names() == ["p"]
    with store.transaction() as db:
        granted = store.settle_approval(db, waiting.id, ApprovalStatus.GRANTED, "ops", 4.0)
        store.rerun_decision(db, waiting.with_verdict("execute", "granted"))
    assert granted is not None and granted.status is ApprovalStatus.GRANTED
    with store.transaction() as db:
        assert store.settle_approval(db, waiting.id, ApprovalStatus.DENIED, "ops", 5.0) is None
    rerun = store.decision(waiting.id)
    assert rerun is not None
    assert (rerun.decision.verdict, rerun.status) == ("execute", DecisionStatus.STARTED)
    request = QuotaRequest("q1", "proj", 8, 3600.0, "why", "ops", 1.0, 100.0)
    store.add_quota_request(request)
    applying = replace(request, status=QuotaStatus.APPLYING)
    assert store.move_quota_request(applying, QuotaStatus.PENDING)
    assert not store.move_quota_request(applying, QuotaStatus.PENDING), "compare and set"
    assert store.quota_requests(QuotaStatus.APPLYING) == [applying]
    x, y = (Alert(f, AlertStatus.FIRING, freeze({})) for f in "xy")
    items = store.inbox_add([x, y], 1.0)
    assert [i.alert for i in store.inbox()] == [x, y]
    store.inbox_done(items[0])
    assert [i.id for i in store.inbox()] == items[1:]
    key = AlertKey("f", "t", "firing")
    assert not store.seen_alert(key, 1.0)
    assert store.seen_alert(key, 2.0), "a retried webhook"
    assert store.alert_known(key)
    store.save_early_resolve("d9", x, 1.0)
    assert store.take_early_resolve("d9") == x
    assert store.take_early_resolve("d9") is None
    store.set_control("paused", "ops@1")
    store.set_control("paused", "ops@2")
    assert store.control("paused") == "ops@2"


def test_an_inbox_batch_is_read_and_recorded_alike(store: Any) -> None:
    """What the alert inbox's worker reads and writes for a batch: which episodes are known,
    the stored decisions among a batch's ids (past 500: several queries), one record."""
    items = store.inbox_add([Alert(f"f{i}", AlertStatus.FIRING, freeze({})) for i in range(3)], 1.0)
    known = AlertKey("f0", "t", "firing")
    store.alerts_handled([known], items[:2], 2.0)
    assert [i.id for i in store.inbox()] == items[2:]
    store.alerts_handled([known], [], 3.0)  # recorded again: nothing changes
    others = [AlertKey(f"x{i}", "t", "firing") for i in range(1200)]
    asked = [*others, AlertKey("f0", "t", "resolved"), AlertKey("f0", "u", "firing"), known]
    assert store.known_alerts(asked) == {known}
    assert store.known_alerts([]) == set()
    d1 = _decision(2.0)
    with store.transaction() as db:
        store.record_decision(db, d1, DecisionStatus.STARTED)
    found = store.stored_decisions([f"unknown-{i}" for i in range(1200)] + [d1.id, d1.id])
    assert list(found) == [d1.id]
    assert found[d1.id].decision == d1 and found[d1.id].status is DecisionStatus.STARTED
    assert store.stored_decisions([]) == {}


def test_a_policy_seen_row_goes_when_the_state_empties_alike(store: Any) -> None:
    """No orphan ``policy_seen`` row once every target left, and
    ``policy_names`` (``gpuops state check``) names a policy that has only that row."""
    a = TargetState(Status.FIRING, 1.0, 2.0, 0.5, freeze({"pool": "a"}))
    refreshed = replace(a, last_seen=2.0 + REFRESH_S)
    for value in (a, refreshed):
        with store.transaction() as db:
            store.save_policy_state(db, "p", PolicyState(freeze({"pool=a": value})))
    with store.transaction() as db:
        assert db.execute("SELECT policy FROM policy_seen").fetchall() == [("p",)]
        store.save_policy_state(db, "p", PolicyState())
    assert store.policy_names() == []
    with store.transaction() as db:
        assert db.execute("SELECT policy FROM policy_seen").fetchall() == []
        db.execute("INSERT INTO policy_seen (policy, at, data) VALUES ('q', 1.0, '[]')")
    assert store.policy_names() == ["q"]


def test_health_events_are_kept_by_id_and_read_back_per_gpu_alike(store: Any) -> None:
    xid = [
        HealthEvent("a-1", "n1", "GPU-1", EventKind.XID, 100.0, 45),
        HealthEvent("a-2", "n1", "GPU-1", EventKind.XID, 50.0, 13),
        HealthEvent("a-3", "n1", "GPU-2", EventKind.XID, 100.0, 45),
        HealthEvent("a-4", "n1", "GPU-1", EventKind.GPU_LOST, 120.0),
    ]
    assert store.health_events_add(xid, 1000.0) == {"a-1", "a-2", "a-3", "a-4"}
    assert store.health_events_add(xid[:1], 1001.0) == set()  # sent again: a duplicate
    assert store.health_events_known(["a-1", "a-4", "b-1"]) == {"a-1", "a-4"}
    assert [(e.id, e.xid, e.at) for e in store.health_xids("n1", "GPU-1", 60.0)] == [
        ("a-1", 45, 100.0)
    ]
    assert [e.id for e in store.health_xids("n1", "GPU-1", 0.0)] == ["a-2", "a-1"]
    returns = [
        HealthEvent("r-1", "n1", "", EventKind.RETURNED, 300.0),
        HealthEvent("r-2", "n1", "", EventKind.RETURNED, 200.0),
        HealthEvent("r-3", "n2", "", EventKind.RETURNED, 100.0),
    ]
    store.health_events_add(returns, 2000.0)
    assert (store.health_returned("n1"), store.health_returned("n2")) == (300.0, 100.0)
    assert store.health_returned("n3") is None
    assert store.health_xids("n1", "", 0.0) == []  # returns are no XIDs
    assert store.prune_health_events(1000.5) == 4
    assert store.health_events_known(["a-1", "r-1"]) == {"r-1"}


def test_a_replica_that_lost_its_lease_writes_nothing(url: str, credentials: Credentials) -> None:
    old, old_lease = _leader(url, credentials, "a")
    standby = PostgresStore(url, credentials, "b")
    try:
        with pytest.raises(FencedError, match=r"this replica \(b\) is not the leader"):
            with standby.transaction():
                pass
        with psycopg.connect(url, password=PASSWORD, autocommit=True) as conn:
            conn.execute("UPDATE gpuops_leader SET expires_at = now() - interval '1 s'")
        taker = Lease(url, credentials, "b", None)
        new_epoch = taker.acquire(30)
        taker.close()
        assert new_epoch is not None
        with pytest.raises(FencedError, match=r"lost the lease of epoch \d+: nothing written"):
            with old.transaction() as db:
                old.record_decision(db, _decision(9.0), DecisionStatus.STARTED)
        assert old.decision(_decision(9.0).id) is None
        assert not old_lease.renew(new_epoch - 1, 30), "the old epoch renews nothing"
    finally:
        old.close()
        old_lease.close()
        standby.close()


def test_a_takeover_waits_for_the_recording_transaction(url: str, credentials: Credentials) -> None:
    """The fence reads the lease row FOR SHARE: a standby whose takeover is due waits until
    the old leader's transaction that recorded decisions has committed, so that the new leader
    sees them (and resumes them) rather than racing them."""
    old = PostgresStore(url, credentials, "a")
    old_lease = Lease(url, credentials, "a", None)
    epoch = old_lease.acquire(2.0)
    assert epoch is not None
    old.fence = lambda: ("a", epoch)
    guarded = _decision(1.0)
    taker = Lease(url, credentials, "b", None, wait_s=30)
    taken: list[int | None] = []
    thread = threading.Thread(target=lambda: taken.append(taker.acquire(30)))
    try:
        with psycopg.connect(url, password=PASSWORD, autocommit=True) as conn:
            with old.transaction() as db:
                old.record_decision(db, guarded, DecisionStatus.STARTED)
                wait_for(
                    lambda: conn.execute(
                        "SELECT expires_at <= now() FROM gpuops_leader"
                    ).fetchone()[0],
                    10,
                    "the lease to expire",
                )
                thread.start()
                wait_for(
                    lambda: conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND application_name = 'gpuops b lease'"
                    ).fetchone()[0],
                    10,
                    "the takeover to wait for the row lock",
                )
                assert taken == []
            thread.join(10)
        assert taken == [epoch + 1]
        assert taker.current().holder == "b"
        new = PostgresStore(url, credentials, "b")
        assert new.decision(guarded.id) is not None, "committed before the takeover"
        new.close()
    finally:
        old.close()
        old_lease.close()
        taker.close()


def test_replicas_starting_together_create_the_schema_once(
    url: str, credentials: Credentials
) -> None:
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one(name: str) -> None:
        try:
            stores.append(PostgresStore(url, credentials, name))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,)) for n in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and len(stores) == 4
    with psycopg.connect(url, password=PASSWORD, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM gpuops_schema").fetchall() == [
            (len(MIGRATIONS) + 1,)
        ]
        conn.execute("UPDATE gpuops_schema SET version = 99")
    for store in stores:
        store.close()
    with pytest.raises(
        StateError, match=f"schema version 99, newer than this engine's {len(MIGRATIONS) + 1}"
    ):
        PostgresStore(url, credentials, "e")


def test_passwords_come_from_a_file_or_the_environment_and_no_message_shows_them(
    url: str, pg: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUOPS_TEST_DB_PASSWORD", PASSWORD)
    PostgresStore(url, Credentials(password_env="GPUOPS_TEST_DB_PASSWORD"), "a").close()
    with pytest.raises(StateError) as unset:
        PostgresStore(url, Credentials(password_env="GPUOPS_UNSET_VARIABLE"), "a")
    assert str(unset.value) == (
        "state.password_env: the environment variable GPUOPS_UNSET_VARIABLE is not set"
    )
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    with pytest.raises(DatabaseUnavailable) as refused:
        PostgresStore(url, Credentials(password_file=wrong), "a")
    message = str(refused.value)
    assert message.startswith(f"{redacted(url)}: cannot connect (")
    assert "password authentication failed" in message
    assert "not-the-password" not in message and PASSWORD not in message
    assert redacted(f"postgresql://u:{PASSWORD}@h:5/d") == "postgresql://u@h:5/d"


def test_state_check_reads_every_row_of_the_database(
    url: str, credentials: Credentials, tmp_path: Path
) -> None:
    (tmp_path / "rules").mkdir()
    config = tmp_path / "engine.yaml"
    config.write_text(
        "rules: [rules]\nmetrics_listen: null\naudit: {spool_dir: audit}\n"
        f"state: {{url: '{url}', password_file: '{credentials.password_file}'}}\n"
    )
    empty = CliRunner().invoke(cli, ["state", "check", "--config", str(config)])
    assert empty.exit_code == 1 and "the database has no gpuops schema" in empty.output
    with psycopg.connect(url, password=PASSWORD, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('gpuops_schema')").fetchone() == (None,)
    store, lease = _leader(url, credentials, "a")  # an engine: it creates the schema
    try:
        with store.transaction() as db:
            assert store.record_decision(db, _decision(1.0), DecisionStatus.STARTED)
    finally:
        store.close()
        lease.close()
    result = CliRunner().invoke(cli, ["state", "check", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert result.output == f"{redacted(url)}: OK\n"
    with psycopg.connect(url, password=PASSWORD, autocommit=True) as conn:
        conn.execute("UPDATE decisions SET data = 'not json'")
    result = CliRunner().invoke(cli, ["state", "check", "--config", str(config)])
    assert result.exit_code == 1
    assert "cannot be decoded" in result.output, result.output


def test_batch_operations_and_their_nodes_in_both_backends(store: Any) -> None:
    from gpuops.store.interface import StoredBatch

    store.save_batch(StoredBatch("op-1", "running", '{"a": 1}', 10.0))
    store.save_batch(StoredBatch("op-0", "done", "{}", 5.0))
    store.save_batch_node("op-1", "gpu-1", '{"status": "pending"}')
    store.save_batch_node("op-1", "gpu-1", '{"status": "done"}')  # replaced, not added
    store.save_batch_node("op-1", "gpu-2", '{"status": "failed"}')
    store.save_batch(StoredBatch("op-1", "paused", '{"a": 2}', 99.0))  # created_at kept
    assert store.batch("op-1") == StoredBatch("op-1", "paused", '{"a": 2}', 10.0)
    assert [b.id for b in store.batches()] == ["op-0", "op-1"]
    assert store.batch_nodes("op-1") == {
        "gpu-1": '{"status": "done"}',
        "gpu-2": '{"status": "failed"}',
    }
    assert store.batch("nope") is None and store.batch_nodes("nope") == {}


def test_ladder_repairs_and_domains_in_both_backends(store: Any) -> None:
    store.save_repair("gpu-1", "remediating", '{"node": "gpu-1"}', 10.0)
    store.save_repair("gpu-1", "returned", '{"node": "gpu-1", "x": 1}', 20.0)  # replaced
    store.save_repair("gpu-0", "needs_human", '{"node": "gpu-0"}', 15.0)
    assert store.repair("gpu-1") == '{"node": "gpu-1", "x": 1}'
    assert store.repairs() == {"gpu-0": '{"node": "gpu-0"}', "gpu-1": '{"node": "gpu-1", "x": 1}'}
    assert store.repair("nope") is None
    store.save_domain("a100", '{"width": 1}')
    store.save_domain("a100", '{"width": 2}')
    assert store.domains() == {"a100": '{"width": 2}'}
