"""Takeover time of two engine replicas on PostgreSQL (issue 14, docs/ha.md).

Run: ``python -m tests.benchmarks.bench_ha [KILLS]`` (default 10; ``make bench`` runs it). Two
``gpuops engine run`` processes on one real PostgreSQL and one real Prometheus with the default
lease (10 s) and renewal (2 s); the policy decides an action every second. KILLS times, with
alternating signals: the leader is SIGKILLed (every other time while an action is held in
flight at the executor), the standby takes over, the killed replica is started again as the
standby. Prints each takeover time (from the kill to the standby's ``/healthz`` saying
``leader``), their p50/p95/max, and what the executor received: deliveries by decision id
(a delivery repeated under the same id is the at-least-once step a kill mid-delivery has;
executors deduplicate on the id), decisions recorded to run but never delivered (lost), and
actions decided twice (two ids for one decision: must be 0). Never fails on noise; exits 1
when a decision was lost or an action doubled.
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import tempfile
from collections import Counter
from functools import partial
from pathlib import Path

from gpuops.sources.promproc import PrometheusServer
from tests.ha import Pair, Replica
from tests.postgres import PostgresServer
from tests.waiting import wait_for

LEASE_S = 10.0
RENEW_S = 2.0


def _more_than(pair: Pair, count: int) -> bool:
    return pair.recorder.count() > count


def _is_standby(replica: Replica) -> bool:
    return replica.role() == "standby"


def main() -> None:
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pg = PostgresServer()
        pg.start()
        prom = PrometheusServer(root / "prom", "global: {scrape_interval: 15s}\n")
        prom.start()
        pair = Pair(root, pg, prom.url, LEASE_S, RENEW_S)
        takeovers: list[float] = []
        interrupted = 0
        try:
            leader = pair.start()
            standby = pair.other(leader)
            wait_for(lambda: standby.role() == "standby", 120, "the standby")
            for kill in range(kills):
                wait_for(lambda: pair.recorder.count() > 0, 60, "an action")
                mid_action = kill % 2 == 1
                if mid_action:
                    pair.recorder.hold()
                    before = pair.recorder.count()
                    wait_for(lambda n=before: pair.recorder.count() > n, 30, "an action in flight")
                    interrupted += 1
                leader.signal(signal.SIGKILL)
                pair.recorder.release()
                new, took = pair.takeover(leader, timeout=120)
                takeovers.append(took)
                print(
                    f"kill {kill + 1:>2} ({'mid-action' if mid_action else 'idle'}):"
                    f" {new.name} leads after {took:5.2f} s",
                    flush=True,
                )
                leader.start()
                wait_for(partial(_is_standby, leader), 120, f"{leader.name} as standby")
                leader = new
            pair.settled(120)
            delivered = pair.recorder.deliveries()
            executed = pair.executed()
            docs = [json.loads(r[0]) for r in pair.rows("SELECT data FROM decisions")]
        finally:
            pair.stop()
            prom.stop()
            pg.stop()
    lost = executed - set(delivered)
    redelivered = {i: n for i, n in delivered.items() if n > 1}
    ordered = sorted(takeovers)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(
        f"\n{len(takeovers)} leader kills, lease {LEASE_S:g} s, renewal {RENEW_S:g} s:"
        f" takeover p50 {statistics.median(ordered):.2f} s, p95 {p95:.2f} s,"
        f" max {ordered[-1]:.2f} s"
    )
    slots = Counter(
        (d["policy"], d["target"]["key"], d["episode_start"], d["transition"], d.get("repeat"))
        for d in docs
        if d["verdict"] == "execute"
    )
    twice = sum(1 for n in slots.values() if n > 1)
    episodes = len({d["episode_start"] for d in docs})
    print(
        f"{len(executed)} actions recorded to run, {len(set(delivered))} delivered,"
        f" {len(lost)} lost; {len(redelivered)} re-delivered under the same id"
        f" ({interrupted} kills landed mid-delivery); {twice} decided twice (two ids for one"
        f" policy, target, episode and repeat); {episodes} episode(s) across all takeovers"
    )
    if lost or twice:
        sys.exit(1)


if __name__ == "__main__":
    main()
