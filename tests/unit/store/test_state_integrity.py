"""State integrity: a state file that cannot be trusted is never a silent reset. A file
truncated to 0 bytes, missing after a run, damaged, or another SQLite database is an error
naming the file and what is wrong; ``gpuops state reset`` is the one (audited) reset; a row that
cannot be decoded skips only its policy, audited and counted.

A scripted Prometheus, a recording executor, an injected clock, built by ``tests.builders``;
the CLI through click's runner. ``gpuops engine run`` as a real process (exit status, no
traceback) and ``/healthz`` of the running API: tests/integration/store/test_state_integrity.py.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuops.audit.spool import read_spool
from gpuops.cli import cli
from gpuops.model.decisions import Decision
from gpuops.runtime import Engine
from gpuops.runtime.approvals import ApprovalError
from gpuops.store.errors import StateError
from gpuops.store.interface import AlertKey
from tests.builders import build_engine, write_rules
from tests.fakes.executors import Recorder
from tests.fakes.prometheus import FakePrometheus

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - policy: reclaim
        expr: idle
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        cooldown: 1h
        mode: enforce
      - policy: downclock
        expr: cool
        for: 0s
        target: [uuid]
        action: {type: downclock, executor: log}
        mode: enforce
      - policy: approved
        expr: ask
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
        approval: required
"""

TARGETS = [{"uuid": f"GPU-{i}"} for i in range(3)]


class World:
    """One directory (state file, spool, rules, an engine configuration for the CLI), one fake
    Prometheus, one recording executor and a clock for every engine a test builds on them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state.sqlite"
        self.spool = tmp / "audit"
        self.prom = FakePrometheus()
        self.log = Recorder()
        self.now = 2_000_000.0
        self.engines: list[Engine] = []
        write_rules(tmp, RULES)
        self.config_file = tmp / "engine.yaml"
        self.config_file.write_text(
            "prometheus: {url: 'http://127.0.0.1:9'}\n"
            "rules: [rules]\n"
            "state_file: state.sqlite\n"
            "audit: {spool_dir: audit}\n"
            "metrics_listen: null\n"
        )

    def engine(self) -> Engine:
        engine = build_engine(
            self.tmp, source=self.prom, clock=lambda: self.now, executors={"log": self.log}
        )
        self.engines.append(engine)
        return engine

    def evaluate(self, engine: Engine, policy: str) -> list[Decision]:
        found = engine.rules.policy(policy)
        assert found is not None
        decisions = engine.evaluate_policy(found)
        assert engine.wait_idle(10)
        return decisions

    def ran_once_and_stopped(self) -> None:
        """An engine reclaimed the 3 targets (1 h cooldown) and stopped."""
        engine = self.engine()
        self.prom.results["idle"] = TARGETS
        self.evaluate(engine, "reclaim")
        assert len(self.log.ran) == 3
        engine.stop()

    def docs(self) -> list[dict[str, Any]]:
        return list(read_spool(self.spool))

    def gpuops(self, *args: str) -> Any:
        return CliRunner().invoke(cli, [*args, "--config", str(self.config_file)])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    for engine in w.engines:
        engine.stop()


def pad(world: World) -> None:
    """Grow the state file to some 30 pages, all in the main file (no WAL left)."""
    db = sqlite3.connect(world.state)
    with db:
        db.executemany(
            "INSERT INTO controls VALUES (?, ?)", [(f"pad-{i}", "x" * 400) for i in range(200)]
        )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def refused(world: World) -> str:
    with pytest.raises(StateError) as caught:
        world.engine()
    return str(caught.value)


# --- files that cannot be trusted -----------------------------------------------------------


def test_a_state_file_truncated_to_zero_bytes_is_an_error_not_a_silent_reset(
    world: World,
) -> None:
    """Not a new state: the 3 targets would re-fire inside their cooldown."""
    world.ran_once_and_stopped()
    world.state.write_bytes(b"")
    message = refused(world)
    assert message == (
        f"{world.state}: the state file is empty (0 bytes) but the audit spool {world.spool}"
        " shows the engine ran before: it was truncated or replaced"
    )
    assert world.state.stat().st_size == 0, "the refused file was changed"
    assert len(world.log.ran) == 3


def test_an_empty_file_before_any_run_is_a_new_state(world: World) -> None:
    world.state.write_bytes(b"")  # e.g. made by touch or a provisioning tool
    engine = world.engine()
    world.prom.results["idle"] = TARGETS[:1]
    assert [d.verdict for d in world.evaluate(engine, "reclaim")] == ["execute"]


MISSING = (
    "{state}: the state file does not exist but the audit spool {spool} shows the engine ran"
    " before: is the volume that holds it mounted, and is state_file right? Starting afresh would"
    " forget cooldowns, firing targets and pending approvals and re-fire what already ran. Put"
    " the file back (mount its volume) and start again, or, to start afresh on purpose, run"
    " `gpuops state reset`"
)


def test_a_missing_state_file_after_a_run_is_an_error_not_a_silent_reset(world: World) -> None:
    """A volume that is not mounted looks like this; starting afresh would re-fire the 3
    targets inside their cooldown."""
    world.ran_once_and_stopped()
    world.state.unlink()
    assert refused(world) == MISSING.format(state=world.state, spool=world.spool)
    assert not world.state.exists(), "the refused start made a state file"
    check = world.gpuops("state", "check")
    assert check.exit_code == 1 and "the state file does not exist" in check.output
    assert not world.state.exists(), "the check made a state file"
    assert len(world.log.ran) == 3


def test_state_reset_of_a_missing_file_starts_afresh_audited(world: World) -> None:
    world.ran_once_and_stopped()
    world.state.unlink()
    result = world.gpuops("state", "reset")
    assert result.exit_code == 0, result.output
    assert result.output.endswith(
        f"\nstate file {world.state} reset; there was no file to keep aside, a new one was made\n"
    )
    (doc,) = [d for d in world.docs() if d.get("event", {}).get("action") == "state.reset"]
    details = doc["gpuops"]["operation"]["details"]
    assert "the state file does not exist" in details["problem"] and "kept_as" not in details
    assert world.gpuops("state", "check").output == f"{world.state}: OK\n"
    engine = world.engine()  # the new file: what ran before is forgotten, on purpose
    world.prom.results["idle"] = TARGETS[:1]
    assert [d.verdict for d in world.evaluate(engine, "reclaim")] == ["execute"]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        pytest.param(
            lambda data: b"\x00garbage\xff" * 100,
            "not a gpuops state database (no SQLite header: starts with",
            id="garbage",
        ),
        pytest.param(
            lambda data: data[:60],
            "not a gpuops state database (truncated: 60 bytes, shorter than the 100-byte",
            id="cut-in-the-header",
        ),
        pytest.param(
            lambda data: data[: len(data) // 2],
            "corrupt state database (",
            id="truncated",
        ),
        pytest.param(
            lambda data: data[: 3 * 4096] + bytes(range(256)) * 16 + data[4 * 4096 :],
            "corrupt state database (",
            id="one-page-overwritten",
        ),
    ],
)
def test_a_damaged_state_file_is_an_error_naming_the_file_and_what_is_wrong(
    world: World, damage: Any, expected: str
) -> None:
    world.ran_once_and_stopped()
    pad(world)  # pages enough to damage one in the middle
    data = world.state.read_bytes()
    assert len(data) > 8 * 4096
    broken = damage(data)
    world.state.write_bytes(broken)
    message = refused(world)
    assert message.startswith(f"{world.state}: {expected}"), message
    assert world.state.read_bytes() == broken, "the refused file was changed"


def test_truncation_says_how_much_is_missing(world: World) -> None:
    world.ran_once_and_stopped()
    pad(world)
    data = world.state.read_bytes()
    world.state.write_bytes(data[: 2 * 4096])
    assert refused(world).endswith(f", truncated: 8192 bytes of the {len(data)} its header says")


def test_another_sqlite_database_is_not_a_state_file(world: World) -> None:
    with sqlite3.connect(world.state) as db:
        db.execute("CREATE TABLE jobs (id INTEGER)")
    assert refused(world) == (
        f"{world.state}: not a gpuops state database (an SQLite database with tables jobs)"
    )


# --- the explicit reset ---------------------------------------------------------------------


def test_state_reset_keeps_the_broken_file_aside_and_is_audited(world: World) -> None:
    world.ran_once_and_stopped()
    world.state.write_bytes(b"")
    assert world.gpuops("state", "check").exit_code == 1
    result = world.gpuops("state", "reset")
    assert result.exit_code == 0, result.output
    (aside,) = world.tmp.glob("state.sqlite.broken-*")
    assert aside.read_bytes() == b""
    assert f"the old one kept as {aside}" in result.output
    (doc,) = [d for d in world.docs() if d.get("event", {}).get("action") == "state.reset"]
    assert doc["event"]["outcome"] == "success"
    assert doc["gpuops"]["operation"]["details"]["kept_as"] == str(aside)
    assert "empty (0 bytes)" in doc["gpuops"]["operation"]["details"]["problem"]
    assert world.gpuops("state", "check").output == f"{world.state}: OK\n"
    world.engine()  # opens the fresh file


def test_state_reset_refuses_while_an_engine_runs(world: World) -> None:
    world.engine()  # holds the audit spool's writer lock
    result = world.gpuops("state", "reset")
    assert result.exit_code == 1
    assert "stop the engine before resetting its state" in result.output
    assert not list(world.tmp.glob("state.sqlite.broken-*"))


# --- one bad row ----------------------------------------------------------------------------


def break_row(world: World, policy: str) -> None:
    with sqlite3.connect(world.state) as db:
        changed = db.execute(  # one target's row (a row per target)
            "UPDATE policy_targets SET data = '{\"status\": ' WHERE policy = ? AND target ="
            " (SELECT MIN(target) FROM policy_targets WHERE policy = ?)",
            (policy, policy),
        ).rowcount
    assert changed == 1


def test_state_reset_of_one_policy_keeps_its_row_aside_and_heals(world: World) -> None:
    world.ran_once_and_stopped()
    break_row(world, "reclaim")
    engine = world.engine()
    assert world.evaluate(engine, "reclaim") == []
    assert "reclaim" in engine.degraded()
    engine.stop()
    result = world.gpuops("state", "reset", "--policy", "reclaim")
    assert result.exit_code == 0, result.output
    (aside,) = world.tmp.glob("state.sqlite.policy-reclaim.broken-*")
    assert aside.read_text().startswith(  # the rows as stored (orjson's compact JSON)
        '{"uuid=GPU-0": {"status": , "uuid=GPU-1": {"status":"firing"'
    )
    (doc,) = [d for d in world.docs() if d["event"]["action"] == "state.reset_policy"]
    assert doc["gpuops"]["operation"]["details"] == {
        "state_file": str(world.state),
        "policy": "reclaim",
        "kept_as": str(aside),
    }
    engine = world.engine()
    world.now += 7200  # past the cooldown, which the guardrail windows still remember
    decisions = world.evaluate(engine, "reclaim")  # a fresh policy state: a new episode
    assert [d.verdict for d in decisions] == ["execute"] * 3
    assert engine.degraded() == {}


def test_state_check_names_a_bad_row_and_the_engine_refuses_a_bad_guardrails_row(
    world: World,
) -> None:
    """The guardrail windows are engine-wide: without them no cooldown holds, so the engine
    does not start (a bad policy row only skips its policy)."""
    world.ran_once_and_stopped()
    break_row(world, "reclaim")
    check = world.gpuops("state", "check")
    assert check.exit_code == 1
    assert f"{world.state}: policy_state row of 'reclaim' cannot be decoded (" in check.output
    with sqlite3.connect(world.state) as db:
        db.execute("UPDATE guardrails SET data = '{\"recent\": []}'")
    engine = world.engine()
    with pytest.raises(StateError) as caught:
        engine.start()
    assert str(caught.value) == (
        f"{world.state}: the guardrails row (cooldowns, rate windows) cannot be decoded"
        " (KeyError: 'last_action')"
    )
    assert world.log.ran[3:] == []


def test_a_bad_decisions_row_stops_the_start_naming_the_file(world: World) -> None:
    world.ran_once_and_stopped()
    with sqlite3.connect(world.state) as db:
        db.execute("UPDATE decisions SET data = 'nope', audited = 0 WHERE rowid = 1")
    engine = world.engine()
    with pytest.raises(StateError) as caught:
        engine.start()
    assert str(caught.value).startswith(f"{world.state}: a decisions row cannot be decoded (")


def test_granting_an_approval_of_a_policy_with_a_bad_row_is_refused_with_the_reason(
    world: World,
) -> None:
    engine = world.engine()
    world.prom.results["ask"] = TARGETS[:1]
    (waiting,) = world.evaluate(engine, "approved")
    assert waiting.verdict == "awaiting_approval"
    break_row(world, "approved")
    with pytest.raises(ApprovalError) as caught:
        engine.grant(waiting.id, "alice")
    assert str(caught.value).startswith(
        f"not granted: {world.state}: policy_state row of 'approved' cannot be decoded ("
    )
    assert world.log.ran == []


# --- stored alerts ----------------------------------------------------------------------------


def inbox_rows(world: World, *alerts: str) -> None:
    """Put ``alerts`` (their stored JSON, as written) into the inbox and one into the resolves
    that came early, as a crash or an older engine may have left them."""
    with sqlite3.connect(world.state) as db:
        db.executemany(
            "INSERT INTO alert_inbox (received_at, alert) VALUES (?, ?)",
            [(world.now, alert) for alert in alerts],
        )
        db.execute("INSERT INTO early_resolves VALUES ('f-bad', 'nope', ?)", (world.now,))
    db.close()


ODD = '{"status": "pending", "labels": {"alertname": "X"}, "startsAt": "s1", "fingerprint": "a"}'
GOOD = '{"status": "firing", "labels": {"alertname": "X"}, "startsAt": "s2", "fingerprint": "b"}'


def test_a_bad_inbox_row_does_not_stop_the_start(world: World) -> None:
    """Main: an inbox row whose status was neither firing nor resolved made the start fail
    (ValueError from the inbox). Such a row is handled as resolved, as before the store's
    codecs; a row that cannot be decoded at all stays, logged; the rest is handled."""
    world.engine().stop()  # a state file
    inbox_rows(world, ODD, "not json", GOOD)
    engine = world.engine()
    engine.start()
    deadline = time.monotonic() + 10
    while engine.store.inbox() != [] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.store.inbox() == []  # the undecodable row is not one of them
    assert engine.store.alert_known(AlertKey("a", "s1", "resolved"))
    assert engine.store.alert_known(AlertKey("b", "s2", "firing"))
    with sqlite3.connect(world.state) as db:
        assert db.execute("SELECT id, alert FROM alert_inbox").fetchall() == [(2, "not json")]
    db.close()
    assert engine.store.take_early_resolve("f-bad") is None  # left for the check to report


def test_state_check_names_the_stored_alerts_it_cannot_decode(world: World) -> None:
    world.engine().stop()
    inbox_rows(world, ODD, "not json", GOOD)
    check = world.gpuops("state", "check")
    assert check.exit_code == 1
    assert (
        f"{world.state}: alert_inbox row 1: status 'pending' is neither firing nor resolved:"
        " the engine handles it as resolved"
    ) in check.output
    assert (
        f"{world.state}: alert_inbox row 2 cannot be decoded (JSONDecodeError: " in check.output
        and "it starts 'not json'): the engine leaves it in the inbox" in check.output
    )
    assert (
        f"{world.state}: early_resolves row f-bad cannot be decoded (JSONDecodeError: "
        in check.output
    )
    assert "row 3" not in check.output


def test_state_check_is_ok_with_good_stored_alerts(world: World) -> None:
    world.engine().stop()
    with sqlite3.connect(world.state) as db:
        db.execute(
            "INSERT INTO alert_inbox (received_at, alert) VALUES (1, ?)",
            ('{"status": "resolved", "labels": {}, "fingerprint": "a"}',),
        )
        db.execute("INSERT INTO early_resolves VALUES ('f', '{\"status\": \"resolved\"}', 1)")
    db.close()
    assert world.gpuops("state", "check").output == f"{world.state}: OK\n"
