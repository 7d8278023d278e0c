"""A batch operation on two ``gpuops engine run`` replicas sharing one PostgreSQL (docs/ha.md):
started through the leader's API (the standby refuses it), run by the leader alone; the leader
SIGKILLed mid-rollout, the standby takes over and goes on by itself from each node's next step:
no finished step again, a step the kill interrupted once more with the same decision id, and no
step ever run by a replica that was not leading."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpuops.sources.promproc import PrometheusServer
from tests.ha import TOKEN, Pair
from tests.postgres import PostgresServer
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

NODES = [f"n{i}" for i in range(1, 9)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STEP = """\
import os, sys, time
node, folder = sys.argv[1], sys.argv[2]
with open(os.path.join(folder, node), "a") as out:
    out.write(f"{os.environ['GPUOPS_DECISION_ID']} {os.getppid()} {time.time()}\\n")
time.sleep(0.3)
"""


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    (tmp_path / "nodes.yaml").write_text(
        "nodes:\n" + "".join(f"  - {{name: {n}, pool: p, gpus: 8}}\n" for n in NODES)
    )
    pg = PostgresServer()
    pg.start()
    prom = PrometheusServer(tmp_path / "prom", "global: {scrape_interval: 15s}\n")
    prom.start()
    extra = {"batch": {"nodes": str(tmp_path / "nodes.yaml"), "folder": str(tmp_path)}}
    pair = Pair(tmp_path, pg, prom.url, 2.0, 0.5, extra=extra)
    try:
        yield pair
    finally:
        pair.stop()
        prom.stop()
        pg.stop()


def operation(tmp: Path) -> str:
    (tmp / "step.py").write_text(STEP)
    (tmp / "steps").mkdir()
    return (
        "operation: restart\n"
        "targets: {pool: p, all: true}\n"
        "quarantine: none\n"
        f"step: {{command: [{sys.executable}, {tmp}/step.py, '{{{{ $labels.node }}}}',"
        f" {tmp}/steps]}}\n"
        "canary: 1\nmax_parallel: 2\nmax_unavailable: 2\nenforce: true\n"
    )


def test_takeover_goes_on_with_the_operation(pair: Pair, tmp_path: Path) -> None:
    leader = pair.start()
    standby = pair.other(leader)
    assert leader.proc is not None and standby.proc is not None
    body = {"operation": operation(tmp_path), "file": "restart.yaml"}
    refused = requests.post(f"{standby.url}/api/v1/batch", json=body, headers=AUTH, timeout=10)
    assert refused.status_code == 503 and "standby" in refused.json()["detail"]
    started = requests.post(f"{leader.url}/api/v1/batch", json=body, headers=AUTH, timeout=10)
    assert started.status_code == 201, started.text
    batch = started.json()["id"]
    steps = tmp_path / "steps"
    wait_for(lambda: len(list(steps.iterdir())) >= 3, 60, "three nodes stepped")
    leader.signal(signal.SIGKILL)
    killed_at = time.time()
    new, took = pair.takeover(leader)
    assert new is standby

    def status() -> str:
        answer = requests.get(f"{new.url}/api/v1/batch/{batch}", headers=AUTH, timeout=5)
        return str(answer.json()["status"])

    wait_for(lambda: status() == "done", 60, "the operation done by the new leader")
    runs = {
        path.name: [line.split() for line in path.read_text().splitlines()]
        for path in steps.iterdir()
    }
    assert sorted(runs) == NODES
    again = 0
    for node, lines in runs.items():
        assert len({ident for ident, _, _ in lines}) == 1, f"{node} ran as two decisions"
        assert len(lines) <= 2, f"{node} ran {len(lines)} times"
        again += len(lines) - 1
        for _, parent, at in lines:
            assert int(parent) in (leader.proc.pid, standby.proc.pid)
            if int(parent) == standby.proc.pid:  # the standby ran nothing before it led
                assert float(at) > killed_at, f"{node} stepped by the standby before the kill"
    assert again <= 2  # at most the wave the kill interrupted
    assert any(int(p) == leader.proc.pid for lines in runs.values() for _, p, _ in lines)
    print(f"\nbatch takeover: the new leader in {took:.1f}s, {again} step(s) run again")
