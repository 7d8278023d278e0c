"""High availability (docs/ha.md): two ``gpuops engine run`` replicas on one real PostgreSQL and
one real Prometheus. The leader is SIGKILLed idle, mid-action and with actions recorded but not
yet run, SIGSTOPped past its lease, and cut off from the database; each time the standby takes
over, and the recorder at the executor's far end counts deliveries by decision id: every action
recorded to run arrives (0 lost), none arrives twice except the one whose delivery the kill
interrupted (at-least-once, the executor deduplicates on the id), and the takeover time is
measured. The tests share one replica pair and run in order (the last kill leaves one replica).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator

import pytest
import requests

from gpuops.sources.promproc import PrometheusServer
from tests.ha import TOKEN, Pair
from tests.postgres import PostgresServer
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

LEASE_S = 2.0
RENEW_S = 0.5
TAKEOVER_BOUND_S = 15.0
"""The bound on a takeover (the benchmark measures the p95 with the default lease)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("ha")
    pg = PostgresServer()
    pg.start()
    prom = PrometheusServer(root / "prom", "global: {scrape_interval: 15s}\n")
    prom.start()
    pair = Pair(root, pg, prom.url, LEASE_S, RENEW_S)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()
        prom.stop()
        pg.stop()


def _no_doubles(pair: Pair, allowed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    twice = {i: n for i, n in pair.recorder.deliveries().items() if n > 1 and i not in allowed}
    assert twice == {}, f"delivered more than once: {twice}"


def _audit_complete(pair: Pair) -> None:
    """Across the replicas' spools every executed decision has its intent and exactly one
    success event id (a document written again after a takeover has the same id, which the
    index deduplicates): no gaps, no duplicates."""
    done = {
        r[0]
        for r in pair.rows("SELECT id FROM decisions WHERE verdict = 'execute' AND status = 'done'")
    }  # the engine acts on: later decisions are checked by a later call
    wait_for(
        lambda: all("success" in pair.audit().get(i, {}) for i in done),
        30,
        "every outcome in a spool",
    )
    audit = pair.audit()
    for decision in done:
        assert len(audit[decision]["success"]) == 1, (decision, audit[decision])
        assert "unknown" in audit[decision], f"{decision}: no intent in any spool"


def _none_lost(pair: Pair) -> None:
    pair.settled()
    # the finished decisions first, the deliveries after: the recorder counts a delivery
    # before it answers, and the engine stores an outcome only after the answer, so every
    # finished decision's delivery is in the later read. Read in the other order, a decision
    # the leader (still deciding) recorded between the two reads looked lost (a flake under
    # load: 1 run in 12 at 6 busy loops on 2 cores, the decision delivered a moment later)
    done = pair.executed(done=True)
    delivered = set(pair.recorder.deliveries())
    lost = done - delivered
    assert lost == set(), f"recorded to run, finished, never delivered: {sorted(lost)}"
    assert delivered <= pair.executed(), "a delivery no decision row accounts for"


def test_standby_serves_reads_and_refuses_writes_naming_the_leader(pair: Pair) -> None:
    leader = pair.leader()
    assert leader is not None
    standby = pair.other(leader)
    wait_for(lambda: pair.recorder.count() >= 2, 30, "the leader's first actions")
    health = standby.health()
    assert health is not None and health["leadership"]["leader"] == leader.name
    auth = {"Authorization": f"Bearer {TOKEN}"}
    listed = requests.get(standby.url + "/api/v1/decisions", headers=auth, timeout=5)
    assert listed.status_code == 200 and listed.json(), "a standby serves the shared decisions"
    refused = requests.post(standby.url + "/api/v1/engine/pause", headers=auth, timeout=5)
    assert refused.status_code == 503
    assert refused.headers["X-Gpuops-Leader"] == leader.url
    assert f"the leader is {leader.name} at {leader.url}" in refused.json()["detail"]
    assert requests.post(leader.url + "/api/v1/engine/pause", headers=auth, timeout=5).ok
    assert requests.post(leader.url + "/api/v1/engine/resume", headers=auth, timeout=5).ok
    # the standby's console says what it is, and a form sent to it gets a page naming the leader
    browser = requests.Session()
    csrf = re.search(r'name="csrf" value="([^"]+)"', browser.get(standby.url + "/login").text)
    assert csrf is not None
    signed = browser.post(
        standby.url + "/login", data={"token": TOKEN, "csrf": csrf.group(1), "next": "/"}
    )
    assert signed.ok, signed.text
    page = browser.get(standby.url + "/").text
    assert "This engine replica is a standby" in page and leader.name in page
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None
    form = browser.post(
        standby.url + "/control/pause", data={"csrf": csrf.group(1), "confirm": "yes"}
    )
    assert form.status_code == 503 and form.headers["content-type"].startswith("text/html")
    assert f"the leader is {leader.name} at {leader.url}" in form.text
    assert form.headers["X-Gpuops-Leader"] == leader.url


def test_sigstop_past_the_lease(pair: Pair) -> None:
    leader = pair.leader()
    assert leader is not None
    wait_for(lambda: not pair.started(), 30, "no action in flight")
    before = pair.recorder.deliveries()
    leader.signal(signal.SIGSTOP)
    new, took = pair.takeover(leader)
    assert took < TAKEOVER_BOUND_S
    leader.signal(signal.SIGCONT)
    wait_for(lambda: leader.role() == "standby", 30, f"{leader.name} to step down")
    _none_lost(pair)
    allowed = {i for i, n in before.items() if n > 1}
    _no_doubles(pair, allowed)


def test_broken_database_connection(pair: Pair) -> None:
    leader = pair.leader()
    assert leader is not None
    # its connections terminated, the leader reconnects within its lease: it stays leader
    pair.rows(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
        f"gpuops {leader.name}%",
    )
    before = pair.recorder.count()
    wait_for(lambda: pair.recorder.count() > before + 1, 30, f"{leader.name} acting again")
    assert leader.role() == "leader"
    # cut off from the database for longer than its lease: the standby takes over
    earlier = pair.recorder.deliveries()
    cut = time.monotonic()
    leader.proxy.cut()
    # what the cut leader had started and not finished, as the database holds it now that
    # the leader can no longer write there: the new leader resumes these under the same id
    # (at-least-once); everything else must be delivered once
    in_flight = pair.started()
    new, _ = pair.takeover(leader)
    took = time.monotonic() - cut
    assert took < TAKEOVER_BOUND_S
    assert leader.role() == "standby", "a leader without its database stops acting"
    leader.proxy.heal()
    _none_lost(pair)  # waits until nothing started is unfinished: resumed ones delivered
    _no_doubles(pair, in_flight | {i for i, n in earlier.items() if n > 1})
    _audit_complete(pair)


def test_sigkill_idle_leader(pair: Pair) -> None:
    leader = pair.leader()
    assert leader is not None
    wait_for(lambda: not pair.started(), 30, "no action in flight")
    earlier = pair.recorder.deliveries()
    leader.signal(signal.SIGKILL)  # returns once the process is gone
    # the engine acts on: an action it started between the wait and the kill was in flight
    # (at-least-once, deduplicated on its id); earlier tests' interrupted ones are theirs
    allowed = pair.started() | {i for i, n in earlier.items() if n > 1}
    new, took = pair.takeover(leader)
    assert took < TAKEOVER_BOUND_S
    leader.start()  # back as the standby for the next test, while this one checks
    before = pair.recorder.count()
    wait_for(lambda: pair.recorder.count() > before + 1, 30, f"{new.name} acting")
    _no_doubles(pair, allowed)
    _none_lost(pair)
    wait_for(lambda: leader.role() == "standby", 60, f"{leader.name} back as a standby")


def test_sigkill_mid_action_and_between_recording_and_executing(pair: Pair) -> None:
    leader = pair.leader()
    assert leader is not None
    pair.recorder.hold()

    # the executor's 4 workers wait on held answers (its timeout is longer than the hold),
    # later decisions queue behind them: recorded ``started`` in the database, not delivered
    # yet. With fewer than 4 held, a free worker would deliver a queued one in a moment.
    def both() -> bool:
        started, delivered = pair.started(), set(pair.recorder.deliveries())
        return bool(started - delivered) and len(started & delivered) >= 4

    wait_for(both, 60, "actions in flight and actions recorded but not yet executed")
    earlier = pair.recorder.deliveries()
    leader.signal(signal.SIGKILL)  # returns once the process is gone
    started, delivered = pair.started(), set(pair.recorder.deliveries())
    # held at the recorder at the kill: in flight, resumed under the same id
    in_flight = started & delivered
    waiting = started - delivered
    assert in_flight and waiting, "the held actions stay started"
    pair.recorder.release()
    new, took = pair.takeover(leader)
    assert took < TAKEOVER_BOUND_S
    _none_lost(pair)
    # the interrupted deliveries were resumed under the same id (executors dedupe on it);
    # the queued ones ran once, by the new leader
    _no_doubles(pair, allowed=in_flight | {i for i, n in earlier.items() if n > 1})
    assert all(pair.recorder.deliveries()[i] == 1 for i in waiting - in_flight)
    _audit_complete(pair)
    # every election of the module is audited once, by the replica elected
    epoch = pair.rows("SELECT epoch FROM gpuops_leader")[0][0]
    wait_for(lambda: pair.elections() == list(range(1, epoch + 1)), 30, "each election audited")
