"""``gpuops audit search|anomalies`` give the same results against the fake Elasticsearch (with
the real client) and against the local spool."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.audit import AuditLog, AuditSettings
from gpuops.audit.spool import segment_paths
from gpuops.cli import cli
from gpuops.model.decisions import Outcome, OutcomeStatus, Transition
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.unit.audit.factories import make_decision, wait_until

NOW = time.time()
"""Set again when the stores are built: the searches' relative windows (`--until 30m`) are
measured from the time the command runs, so the data must be dated from just before it, not
from when pytest collected this module (minutes earlier in a full run)."""
OK = Outcome(OutcomeStatus.SUCCESS, 1, 0.2)


def fail(error: str) -> Outcome:
    return Outcome(OutcomeStatus.FAILURE, 3, 1.0, error)


def populate(audit: AuditLog, clock: list[float]) -> None:
    """A day of decisions and operations with one instance of every anomaly."""
    at = NOW - 20 * 3600
    for n in range(3):  # flapping: fire/clear 3 episodes on one GPU
        for transition in (Transition.FIRE, Transition.CLEAR):
            at += 60
            decision = make_decision(
                "execute",
                "downclock-underused",
                {"node": "n2", "uuid": "GPU-F"},
                at,
                transition,
                "downclock" if transition is Transition.FIRE else "restore_clocks",
                episode=at - n,
            )
            audit.decision(decision, None)  # the intent, written before the action runs
            audit.decision(decision, OK)
    for n in range(4):  # one target reclaimed again and again
        decision = make_decision(labels={"node": "n3", "uuid": "GPU-R"}, at=at + n * 600, episode=n)
        audit.decision(decision, OK)
    for n, verb in enumerate(["reclaim", "downclock", "restore_clocks"]):  # three, once each:
        labels = {"node": "n5", "uuid": "GPU-M"}  # acted on, but no action repeated
        audit.decision(make_decision(labels=labels, at=at + 30 + n, action=verb), OK)
    for n in range(3):  # migrate failing on one node
        labels = {"node": "n7", "uuid": f"GPU-{n}"}
        decision = make_decision(
            "execute", "migrate-off-down-nodes", labels, at + n, action="migrate"
        )
        audit.decision(decision, fail("fleet API: HTTP 503"))
    for n, job in enumerate(["j1", "j1", "j2"]):  # jobs failing with GPU OOM
        labels = {"node": "n4", "uuid": f"GPU-O{n}", "job": job}
        decision = make_decision(
            "execute", "restart-failed-jobs", labels, at + 7 + n, action="restart"
        )
        audit.decision(decision, fail("CUDA error: out of memory"))
    dry = make_decision(
        "dry_run", "scale-out-on-queue", {"pool": "a100"}, NOW - 3600, action="scale_out"
    )
    audit.decision(dry, None)
    audit.decision(dry, None)  # recorded twice: stored once
    suppressed = make_decision("suppressed:cooldown", reason="cooldown 1h", at=NOW - 1800)
    audit.decision(suppressed, None)
    audit.decision(make_decision(labels={"node": "n9", "uuid": "GPU-9"}, at=NOW - 48 * 3600), OK)
    for n in range(30):  # alice: a burst in the last hour, after a quiet day
        clock[0] = NOW - (60 * n if n < 26 else 10 * 3600 + n)
        audit.operation(
            "alice", ["admin"], "grant_approval", "success", "10.0.0.1", f"granted a{n}"
        )
    for n in range(5):
        clock[0] = NOW - 3 * 3600 - n
        audit.operation("bob", ["developer"], "list_decisions", "success", "10.0.0.2", "listed")
    clock[0] = NOW - 100
    audit.operation(
        "mallory", [], "authenticate", "failure", "10.6.6.6", "invalid token", error="401"
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    global NOW
    NOW = time.time()
    spool = tmp_path_factory.mktemp("spool")
    clock = [NOW]
    with AuditLog(AuditSettings(spool_dir=spool), host_name="h", clock=lambda: clock[0]) as audit:
        populate(audit, clock)
    shipped = tmp_path_factory.mktemp("shipped")
    for segment in segment_paths(spool):
        shutil.copy(segment, shipped)
    with FakeElasticsearch() as es:
        settings = AuditSettings(spool_dir=shipped, elasticsearch_url=es.url, poll_interval_s=0.01)
        with AuditLog(settings, host_name="h") as shipper:
            wait_until(lambda: shipper.pending == 0, what="the spool to ship")
        yield es.url, spool


def run(args: list[str]) -> list[dict[str, object]]:
    result = CliRunner().invoke(cli, ["audit", *args, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def both(stores: tuple[str, Path], args: list[str]) -> list[dict[str, object]]:
    url, spool = stores
    from_es = run(["search", *args, "--url", url])
    from_spool = run(["search", *args, "--spool-dir", str(spool)])
    assert from_es == from_spool
    return from_es


@pytest.mark.parametrize(
    ("args", "count"),
    [
        ([], 50),
        (["--limit", "1000"], 63),  # with the 6 intents of the flapping clears/fires
        (["--since", "7d", "--limit", "1000"], 64),
        (["--policy", "migrate-off-down-nodes"], 3),
        (["--user", "alice", "--since", "2h"], 26),
        (["--action", "authenticate", "--outcome", "failure"], 1),
        (["--outcome", "unknown"], 8),  # intents have no outcome yet
        (["--label", "node=n7", "--label", "uuid=GPU-1"], 1),
        (["--text", "out of memory", "--stream", "decision"], 3),
        (["--text", "cooldown"], 1),
        (["--stream", "audit", "--limit", "7"], 7),
        (["--since", "2h", "--until", "30m"], 2),
    ],
)
def test_search_gives_the_same_results_from_elasticsearch_and_the_spool(
    stores: tuple[str, Path], args: list[str], count: int
) -> None:
    docs = both(stores, args)
    assert len(docs) == count
    stamps = [str(d["@timestamp"]) for d in docs]
    assert stamps == sorted(stamps, reverse=True)


def test_anomalies_are_the_same_from_elasticsearch_and_the_spool(
    stores: tuple[str, Path],
) -> None:
    url, spool = stores
    from_es = [json.loads(x) for x in _anomalies(["--url", url])]
    from_spool = [json.loads(x) for x in _anomalies(["--spool-dir", str(spool)])]
    assert from_es == from_spool
    assert [(f["check"], f["keys"], f["count"]) for f in from_es] == [
        ("flapping_policy", {"policy": "downclock-underused", "target": "node=n2,uuid=GPU-F"}, 3),
        ("repeated_target", {"target": "node=n2,uuid=GPU-F", "action": "downclock"}, 3),
        ("repeated_target", {"target": "node=n2,uuid=GPU-F", "action": "restore_clocks"}, 3),
        ("repeated_target", {"target": "node=n3,uuid=GPU-R", "action": "reclaim"}, 4),
        ("failing_on_node", {"node": "n4", "action": "restart"}, 3),
        ("failing_on_node", {"node": "n7", "action": "migrate"}, 3),
        ("oom_job", {"job": "j1"}, 2),
        ("oom_node", {"node": "n4"}, 3),
        ("unusual_user_operations", {"user": "alice"}, 26),
    ]


def _anomalies(args: list[str]) -> list[str]:
    result = CliRunner().invoke(cli, ["audit", "anomalies", "--json", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_search_prints_a_table_by_default(stores: tuple[str, Path]) -> None:
    result = CliRunner().invoke(
        cli, ["audit", "search", "--spool-dir", str(stores[1]), "--user", "bob"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["@timestamp", "action", "outcome", "who", "message"]
    assert len(lines) == 6 and "list_decisions" in lines[1] and "bob" in lines[1]


def test_search_without_spool_or_url_says_what_is_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["audit", "search", "--spool-dir", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert f"no audit spool at {tmp_path / 'none'} (and no --url given)" in result.output


def test_the_only_user_of_a_fresh_install_is_not_flagged(tmp_path: Path) -> None:
    """An hour-old install: its one admin's 40 operations have no history to be compared
    with; a user with a quiet history before the same burst is flagged."""
    now = time.time()
    clock = [now]
    with AuditLog(AuditSettings(spool_dir=tmp_path), host_name="h", clock=lambda: clock[0]) as log:
        for n in range(40):
            clock[0] = now - 60 * n
            log.operation("root", ["admin"], "set_kill_switch", "success", None, f"op {n}")
    fresh = _anomalies(["--spool-dir", str(tmp_path)])
    assert [f for f in fresh if json.loads(f)["check"] == "unusual_user_operations"] == []
    with AuditLog(AuditSettings(spool_dir=tmp_path), host_name="h", clock=lambda: clock[0]) as log:
        for n in range(3):  # the same admin, a day ago: now a history to compare with
            clock[0] = now - 20 * 3600 - n
            log.operation("root", ["admin"], "set_kill_switch", "success", None, f"old {n}")
    [known] = [json.loads(f) for f in _anomalies(["--spool-dir", str(tmp_path)])]
    assert (known["check"], known["keys"], known["count"]) == (
        "unusual_user_operations",
        {"user": "root"},
        40,
    )
