"""Audit throughput and loss-freedom against the fake Elasticsearch on loopback (issue 4, item 7).

Run: ``python -m tests.benchmarks.bench_audit [--events 10000] [--outage-s 60]``. Prints:
events/s from ``AuditLog.decision`` to an acknowledged bulk item, and the lost/duplicated counts
(expected 0/0) of a stream with an outage of the fake in the middle and an engine (AuditLog)
restart during the outage. Not a timed test: it reports figures, it does not fail on noise.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from engine.audit import AuditLog, AuditSettings
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.unit.audit.factories import make_decision, wait_until

DECISIONS = "logs-gpuops.decision-default"


def settings(spool: Path, url: str) -> AuditSettings:
    return AuditSettings(
        spool_dir=spool,
        elasticsearch_url=url,
        segment_max_age_s=0.2,
        poll_interval_s=0.05,
        backoff_initial_s=0.2,
        backoff_max_s=5.0,
        close_timeout_s=2.0,
    )


def throughput(events: int) -> None:
    with FakeElasticsearch() as es, tempfile.TemporaryDirectory() as tmp:
        with AuditLog(settings(Path(tmp), es.url), host_name="bench") as audit:
            started = time.perf_counter()
            for i in range(events):
                audit.decision(make_decision(labels={"node": "n", "uuid": str(i)}), None)
            appended = time.perf_counter() - started
            wait_until(lambda: len(es.documents(DECISIONS)) == events, timeout_s=600)
            shipped = time.perf_counter() - started
    print(f"append (fsync'd) to spool:     {events / appended:10.0f} events/s ({events} events)")
    print(f"decision -> acknowledged bulk: {events / shipped:10.0f} events/s ({shipped:.2f}s)")


def outage(events: int, outage_s: float, duration_s: float) -> None:
    rate = events / duration_s
    acknowledged: list[str] = []
    with FakeElasticsearch() as es, tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        audit = AuditLog(settings(spool, es.url), host_name="bench")
        audit.start()
        down_at, up_at = (duration_s - outage_s) / 2, (duration_s + outage_s) / 2
        restart_at = (down_at + up_at) / 2
        down = restarted = recovered = False
        started = time.monotonic()
        for i in range(events):
            now = time.monotonic() - started
            if not down and not recovered and now >= down_at:
                es.stop()
                down = True
                print(f"  t={now:5.1f}s  Elasticsearch down")
            if down and not restarted and now >= restart_at:
                audit.close()
                audit = AuditLog(settings(spool, es.url), host_name="bench")
                audit.start()
                restarted = True
                print(f"  t={now:5.1f}s  engine restarted with {audit.pending} documents spooled")
            if down and now >= up_at:
                es.start()
                down, recovered = False, True
                print(f"  t={now:5.1f}s  Elasticsearch back")
            acknowledged.append(
                audit.decision(make_decision(labels={"node": "n", "uuid": str(i)}), None)
            )
            delay = started + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if down:
            es.start()
        wait_until(lambda: audit.pending == 0, timeout_s=300, what="the spool to drain")
        drained = time.monotonic() - started
        counters = audit.registry
        duplicates_409 = (
            counters.get_sample_value(
                "gpuops_audit_shipped_documents_total", {"result": "duplicate"}
            )
            or 0.0
        )
        audit.close()
        stored = [d["event"]["id"] for d in es.documents(DECISIONS)]
    copies = Counter(stored)
    lost = len(set(acknowledged) - set(copies))
    duplicated = sum(n - 1 for n in copies.values())
    print(f"outage stream: {events} events at {rate:.0f}/s, {outage_s:.0f}s outage, 1 restart")
    print(f"  drained {drained - duration_s:.1f}s after the stream ended")
    print(
        f"  acknowledged {len(acknowledged)}, stored {len(stored)}, 409s after restart "
        f"{duplicates_409:.0f}"
    )
    print(f"  lost {lost}, duplicated {duplicated}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--outage-s", type=float, default=60.0)
    parser.add_argument("--duration-s", type=float, default=None, help="default: outage + 30s")
    args = parser.parse_args()
    throughput(args.events)
    outage(args.events, args.outage_s, args.duration_s or args.outage_s + 30.0)


if __name__ == "__main__":
    main()
