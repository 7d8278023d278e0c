"""Audit throughput and loss-freedom against the fake Elasticsearch in ANOTHER process. Prints
figures; never fails on noise.

Run: ``python -m tests.benchmarks.bench_audit [--events 100000] [--outage-s 60] [--rate 2000]``.

1. Throughput: ``--events`` decisions (built beforehand, as the evaluation would) written by 4
   threads through ``AuditLog.write_ahead`` in batches of ``--batch`` (a cycle's intents, and
   the gate's concurrent outcomes), shipped to the fake Elasticsearch running in its own
   process. Prints events/s from the first write to the last acknowledged bulk item, the
   engine process' CPU per event (documents, spool, shipper) and the fake's CPU separately.
   The fake keeps only ids (``keep_sources = False``) but checks every document against the
   mapping as Elasticsearch would, then the same again without mapping checks. The decisions
   are realistic (``decisions``: per-target evidence and times, a mix of verdicts with the
   guardrails' per-target reasons): the headline figure; ``--inputs uniform`` (or ``both``)
   gives the best case (``decisions``, ``uniform``).
2. Loss and duplicates: an engine process (``--writer``) streams decisions at ``--rate`` while
   Elasticsearch goes away for ``--outage-s``; the engine is SIGKILLed in the middle of the
   outage and again while the backlog drains (bulk requests in flight), each time restarted on
   the same spool. At the end the fake is asked what every write did (``write_tally``: each
   ``_id``'s 201s, 409s and overwrites, and each stored write's ``event.id``): every id an
   engine had acknowledged (``write_ahead`` returned) must be stored, and stored by one write
   only (0 lost, 0 duplicated: a second 201 or an ``index`` overwrite of an ``_id``, or an
   event.id in two documents, is a duplicate; a resend answered 409 stores nothing and is
   counted apart, as resends).

``--before <tree>`` first runs the same figures with the engine and the fake of another tree
(another commit checked out; ``PYTHONPATH=<tree>`` for this file's child processes, which run
it by path), to compare two versions on one machine. Figures: docs/audit-performance.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve()
DECISIONS = "logs-gpuops.decision-default"
WRITER_BATCH = 250
"""Decisions per write_ahead of the outage run's writer: a cycle's intents, as the throughput
run's default ``--batch`` (at 100, one fsync per 100 decisions held the writer below 20,000/s)."""


def settings(spool: Path, url: str) -> Any:
    from gpuops.audit import AuditSettings

    return AuditSettings(
        spool_dir=spool,
        elasticsearch_url=url,
        segment_max_age_s=0.2,
        poll_interval_s=0.05,
        backoff_initial_s=0.2,
        backoff_max_s=2.0,
        close_timeout_s=5.0,
        max_spool_bytes=8 * 1024 * 1024 * 1024,  # a 60 s outage at 20,000/s spools ~1.6 GB
    )


CYCLE_TARGETS = 5_000  # decisions of one evaluation cycle (they share its time)
CYCLE_S = 15.0


def decisions(first: int, count: int, uniform: bool = False) -> list[Any]:
    """Decisions for GPUs ``first``... as the engine makes them
    (``gpuops.model.evaluation._decide``,
    then the guardrails' verdict): two policies (one enforced, one in dry-run), each sharing
    its ``ActionSpec``, query and labels (read-only mappings, encoded once); per target its own
    ``Evidence`` (value, and ``pending_since``/``episode_start``, when its condition began),
    repeat and reason; ``at`` and ``observed_at`` the cycle's time (a cycle every 15 s of 5,000
    decisions). Verdicts: of the enforced policy's decisions 40% execute, 30% suppressed by
    cooldown, 10% by max_per_hour, 10% awaiting approval, 10% by max_fraction, each
    suppression with the guardrail's per-target reason (``gpuops.model.guardrails``); the dry-run
    policy's are dry_run. Built in a few us each, so that the outage run's writer can offer
    20,000/s.

    ``uniform``: the best case: one policy, one ``Evidence`` and one time for all, every
    verdict ``execute`` and no reason."""
    from gpuops.model.decisions import (
        ActionSpec,
        Decision,
        Evidence,
        Target,
        Transition,
        Verdict,
        decision_id,
        freeze,
    )

    if uniform:
        return _uniform(first, count)
    base = 1_700_000_000.0
    policies = (
        (
            "reclaim-idle-gpus",
            "gpu-efficiency",
            "enforce",
            ActionSpec("reclaim", "fleet", freeze({"grace_s": 30})),
            "max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.2",
            freeze({"team": "platform"}),
        ),
        (
            "downclock-underused",
            "gpu-energy",
            "dry-run",
            ActionSpec("set_clocks", "fleet", freeze({"max_mhz": 1200})),
            "avg_over_time(nvml_gpu_utilization_ratio[15m]) < 0.5",
            freeze({"team": "energy", "tier": "2"}),
        ),
    )
    verdicts = [Verdict.EXECUTE] * 4 + [Verdict.SUPPRESSED_COOLDOWN] * 3
    verdicts += [Verdict.SUPPRESSED_MAX_PER_HOUR, Verdict.AWAITING_APPROVAL]
    verdicts += [Verdict.SUPPRESSED_MAX_FRACTION]
    built = []
    for i in range(first, first + count):
        name, group, mode, spec, expr, labels = policies[i % 2]
        at = base + (i // CYCLE_TARGETS) * CYCLE_S
        start = at - 300 - (i * 7919) % 86_400  # this target's episode: since when it holds
        repeat = (i // 2) % 3
        node, uuid = f"node-{i // 8}", f"GPU-{i:09d}"
        key = f"node={node},uuid={uuid}"
        if repeat:
            reason = f"still firing (decision {repeat + 1} of this episode)"
        else:
            reason = f"condition held for {at - start:.0f}s (for: 300s)"
        verdict = Verdict.DRY_RUN if mode == "dry-run" else verdicts[(i // 2) % 10]
        if verdict is Verdict.SUPPRESSED_COOLDOWN:
            ago = (i * 31) % 3600
            reason = (
                f"cooldown 3600s: last action on this target {ago:.0f}s ago, {3600 - ago:.0f}s left"
            )
        elif verdict is Verdict.SUPPRESSED_MAX_PER_HOUR:
            reason = f"{20 + i % 5} actions in the last hour, limit max_per_hour=20"
        elif verdict is Verdict.SUPPRESSED_MAX_FRACTION:
            reason = (
                f"{i % 997} of {CYCLE_TARGETS} targets acted on in the last hour, limit "
                f"max_fraction=0.1 allows {CYCLE_TARGETS // 10}"
            )
        built.append(
            Decision(
                id=decision_id(name, key, start, "fire", repeat),
                policy=name,
                group=group,
                target=Target(key, freeze({"node": node, "uuid": uuid})),
                transition=Transition.FIRE,
                action=spec,
                evidence=Evidence(expr, (i % 200) / 1000, start, at),
                at=at,
                episode_start=start,
                repeat=repeat,
                verdict=verdict,
                reason=reason,
                mode=mode,
                labels=labels,
            )
        )
    return built


def _uniform(first: int, count: int) -> list[Any]:
    from gpuops.model.decisions import (
        ActionSpec,
        Decision,
        Evidence,
        Target,
        Transition,
        Verdict,
        decision_id,
        freeze,
    )

    policy, at = "reclaim-idle-gpus", 1_700_000_000.0
    start = at - 600
    spec = ActionSpec("reclaim", "fleet", freeze({"grace_s": 30}))
    labels = freeze({"team": "platform"})
    evidence = Evidence("max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.2", 0.05, start, at)
    built = []
    for i in range(first, first + count):
        node, uuid = f"node-{i // 8}", f"GPU-{i:09d}"
        key = f"node={node},uuid={uuid}"
        built.append(
            Decision(
                id=decision_id(policy, key, start, "fire"),
                policy=policy,
                group="gpu-efficiency",
                target=Target(key, freeze({"node": node, "uuid": uuid})),
                transition=Transition.FIRE,
                action=spec,
                evidence=evidence,
                at=at,
                episode_start=start,
                verdict=Verdict.EXECUTE,
                reason="",
                mode="enforce",
                labels=labels,
            )
        )
    return built


# -- the fake Elasticsearch in its own process --------------------------------------------------


def serve_fake_es(validate: bool) -> None:
    """Child: a fake Elasticsearch; commands on stdin: stop, start, stats, quit."""
    from tests.fakes.fake_elasticsearch import FakeElasticsearch

    es = FakeElasticsearch()
    es.validate = validate
    es.keep_sources = False  # ids only (dedup and the counts below need nothing more)
    es.tally_field = "event.id"  # every stored write's event.id counted (duplicates)
    es.start()
    print(es.port, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stop":
            es.stop()
            print("stopped", flush=True)
        elif command == "start":
            es.start()
            print("started", flush=True)
        elif command == "stats":
            print(json.dumps({"cpu_s": time.process_time()}), flush=True)
        elif command == "tally":
            print(json.dumps(_tally(es)), flush=True)
        elif command == "quit":
            break
    es.stop()


def _tally(es: Any) -> dict[str, Any]:
    """The fake's ``write_tally`` of the decisions' stream; from an older tree's fake, which
    has no tally, its ids (``ids()``, or the event.id of its whole documents): such a count
    cannot see a second copy of one ``_id``."""
    if hasattr(es, "write_tally"):
        tally: dict[str, Any] = es.write_tally(DECISIONS)
        return tally
    if hasattr(es, "ids"):  # the _id is the event.id
        ids = es.ids(DECISIONS)
    else:
        with es.lock:
            ids = [d["event"]["id"] for d in es.documents(DECISIONS)]
    copies = Counter(ids)
    return {
        "ids": ids,
        "stored_more_than_once": {},
        "resends": 0,
        "resent_ids": 0,
        "field": "event.id",
        "field_values": list(copies),
        "field_more_than_once": {i: n for i, n in copies.items() if n > 1},
    }


def count(tally: dict[str, Any], acknowledged: Sequence[str]) -> dict[str, int]:
    """Lost and duplicated decisions from the fake's ``write_tally`` and the event ids the
    engines acknowledged: ``lost``, acknowledged but not stored (by event.id, and by ``_id``,
    which is the event.id); ``duplicated``, stored by more than one write (an ``_id`` created
    twice or overwritten by op ``index``, or an event.id in two stored documents);
    ``extra_copies``, the stored writes beyond the first of those; ``resends``, the 409s
    (a resend of a stored document, which stores nothing: allowed); ``unacknowledged``, stored
    but never acknowledged (written when a kill came)."""
    ids = set(tally["ids"])
    values = set(tally["field_values"]) if tally["field"] else ids
    by_id, by_value = tally["stored_more_than_once"], tally["field_more_than_once"]
    acked = set(acknowledged)
    return {
        "lost": len(acked - values),
        "duplicated": len(set(by_id) | set(by_value)),
        "extra_copies": sum(
            max(by_id.get(k, 1), by_value.get(k, 1)) - 1 for k in set(by_id) | set(by_value)
        ),
        "resends": int(tally["resends"]),
        "resent_ids": int(tally["resent_ids"]),
        "stored": len(ids),
        "unacknowledged": len(values - acked),
    }


class FakeEs:
    """The parent's handle on the fake Elasticsearch process."""

    def __init__(self, validate: bool = True) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--serve-fake-es", "1" if validate else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # tracebacks of the connections a kill cuts
            text=True,
            env=os.environ.copy(),
        )
        self.url = f"http://127.0.0.1:{self._read()}"

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fake Elasticsearch process died")
        return line.strip()

    def command(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = json.loads(self.command("stats"))
        return stats

    def tally(self) -> dict[str, Any]:
        tally: dict[str, Any] = json.loads(self.command("tally"))
        return tally

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(30)


# -- 1. throughput ------------------------------------------------------------------------------


def throughput(events: int, batch: int, threads: int, validate: bool, uniform: bool) -> None:
    from gpuops.audit import AuditLog

    es = FakeEs(validate)
    prepared = decisions(0, events, uniform)
    chunks = [prepared[i : i + batch] for i in range(0, events, batch)]
    # The inputs (~1.5 million objects for 100,000 decisions, which the evaluation would have
    # made and dropped cycle by cycle) are collected here, before the clock starts: else the
    # first full collection inside the measured window walks them all (0.38 s, 3.8 us/event),
    # a cost of building the inputs, not of the audit.
    gc.collect()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            audit = AuditLog(settings(Path(tmp), es.url), host_name="bench")
            audit.start()
            fake_cpu = es.stats()["cpu_s"]
            cpu = time.process_time()
            polling = time.thread_time()  # this thread only waits and polls the metrics
            started = time.perf_counter()

            def produce(mine: Sequence[list[Any]]) -> None:
                for chunk in mine:
                    audit.write_ahead([(d, None) for d in chunk])

            workers = [
                threading.Thread(target=produce, args=(chunks[n::threads],)) for n in range(threads)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            appended = time.perf_counter() - started
            acked = ("created", "duplicate")
            while sum(_sample(audit, r) for r in acked) < events:
                time.sleep(0.01)
            shipped = time.perf_counter() - started
            engine_cpu = time.process_time() - cpu
            polling = time.thread_time() - polling
            audit.close()
            fake_cpu = es.stats()["cpu_s"] - fake_cpu
    finally:
        es.close()
    checks = "with" if validate else "WITHOUT"
    inputs = "uniform (best case: one evidence, time, verdict)" if uniform else "realistic"
    print(
        f"{events} decisions ({inputs}), {threads} writer threads, write_ahead batches of "
        f"{batch}, fake Elasticsearch {checks} mapping checks"
    )
    print(f"  append (fsync'd) to spool:      {events / appended:10.0f} events/s")
    print(f"  decision -> acknowledged bulk:  {events / shipped:10.0f} events/s ({shipped:.2f} s)")
    print(
        f"  engine process CPU:             {engine_cpu / events * 1e6:10.1f} us/event "
        f"({events / engine_cpu:.0f} events per engine CPU-second)"
    )
    print(
        f"    of which the benchmark's polling of the metrics: {polling / events * 1e6:.1f} us"
        f"/event; the engine alone {(engine_cpu - polling) / events * 1e6:.1f} us/event"
    )
    print(f"  fake Elasticsearch process CPU: {fake_cpu / events * 1e6:10.1f} us/event")


def _sample(audit: Any, result: str) -> float:
    value = audit.registry.get_sample_value(
        "gpuops_audit_shipped_documents_total", {"result": result}
    )
    return float(value or 0.0)


# -- 2. outage and SIGKILLs ---------------------------------------------------------------------


def writer(spool: str, url: str, first: int, rate: float, count: int) -> None:
    """Child: an engine's audit, streaming ``count`` decisions (0: until killed) at ``rate``/s in
    batches of ``WRITER_BATCH``, printing each acknowledged event id; then drains the spool and
    exits."""
    from gpuops.audit import AuditLog

    audit = AuditLog(settings(Path(spool), url), host_name="bench-writer")
    audit.start()
    print(f"pending {audit.pending}", flush=True)
    step = WRITER_BATCH
    started = time.monotonic()
    n = 0
    while count == 0 or n < count:
        ids = audit.write_ahead([(d, None) for d in decisions(first + n, step)])
        sys.stdout.write("".join(f"{i}\n" for i in ids))
        sys.stdout.flush()
        n += step
        delay = started + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    while audit.pending:
        time.sleep(0.05)
    audit.close()
    print("drained", flush=True)


class Writer:
    """The parent's handle on one engine (writer) process and the ids it acknowledged."""

    def __init__(self, spool: Path, url: str, first: int, rate: float, count: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--writer", str(spool), url, str(first), str(rate)]
            + [str(count)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        self.acknowledged: list[str] = []
        self.first_ack = self.last_ack = 0.0  # monotonic times of the first and last id read
        self.drained = threading.Event()
        assert self.proc.stdout is not None
        self.pending_at_start = int(self.proc.stdout.readline().split()[-1])
        self._thread = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            line = line.strip()
            if line == "drained":
                self.drained.set()
            elif line:
                self.last_ack = time.monotonic()
                self.first_ack = self.first_ack or self.last_ack
                self.acknowledged.append(line)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._thread.join(30)


def outage(outage_s: float, rate: float, warm_s: float = 10.0, tail_s: float = 10.0) -> None:
    es = FakeEs()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spool = Path(tmp) / "spool"
            started = time.monotonic()

            def at(t: float, what: str) -> None:
                delay = started + t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                print(f"  t={time.monotonic() - started:6.1f}s  {what}", flush=True)

            first = Writer(spool, es.url, 0, rate)
            at(warm_s, "Elasticsearch down")  # (the command after the wait: it was an argument
            es.command("stop")  # of at(), so the outage began at t=0 and ended 30 s early)
            at(warm_s + outage_s / 2, "SIGKILL the engine during the outage; restart it")
            first.kill()
            second = Writer(spool, es.url, 10_000_000, rate)
            print(f"           restarted with {second.pending_at_start} documents spooled")
            at(warm_s + outage_s, "Elasticsearch back")
            es.command("start")
            at(warm_s + outage_s + 3.0, "SIGKILL the engine while the backlog drains; restart")
            stored_at_kill = len(es.tally()["ids"])
            second.kill()
            third = Writer(spool, es.url, 20_000_000, rate, count=int(rate * tail_s))
            print(
                f"           {stored_at_kill} stored at the kill; restarted with "
                f"{third.pending_at_start} spooled"
            )
            if not third.drained.wait(900):
                print("  the last engine did not drain its spool within 15 minutes")
            third.proc.wait(60)
            at(0, "spool drained")
            tally = es.tally()
    finally:
        es.close()
    acknowledged = first.acknowledged + second.acknowledged + third.acknowledged
    counted = count(tally, acknowledged)
    print(f"outage stream: {rate:.0f} decisions/s offered, {outage_s:.0f} s outage, 2 SIGKILLs")
    for name, w in (("first", first), ("second", second), ("third", third)):
        took = w.last_ack - w.first_ack
        # the first batch's ids are all read at first_ack: the rate is of those after it
        achieved = f"{(len(w.acknowledged) - WRITER_BATCH) / took:.0f}/s" if took > 0 else "-"
        print(f"  {name} engine: {len(w.acknowledged)} acknowledged, {achieved} written")
    print(f"  acknowledged {len(acknowledged)}, stored {counted['stored']}")
    print(
        f"  stored but never acknowledged (written when a kill came): {counted['unacknowledged']}"
    )
    print(
        f"  resends answered 409 (already stored, nothing stored again): {counted['resends']} "
        f"for {counted['resent_ids']} ids"
    )
    print(
        f"  lost {counted['lost']}, duplicated {counted['duplicated']} (stored more than once, "
        f"by _id and by event.id; {counted['extra_copies']} extra copies)"
    )


def main() -> None:
    if sys.argv[1:2] == ["--serve-fake-es"]:
        serve_fake_es(sys.argv[2] == "1")
        return
    if sys.argv[1:2] == ["--writer"]:
        spool, url, first, rate, count = sys.argv[2:7]
        writer(spool, url, int(first), float(rate), int(count))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--outage-s", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="decisions/s in the outage run")
    parser.add_argument(
        "--inputs",
        choices=("realistic", "uniform", "both"),
        default="realistic",
        help="the throughput run's decisions: per-target evidence, times, verdicts and reasons "
        "(realistic, the headline figure), or the best case of one evidence, time and verdict "
        "(uniform), or both",
    )
    parser.add_argument("--skip-outage", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true", help="only the outage run")
    parser.add_argument(
        "--before",
        metavar="TREE",
        help="first run the same figures with the engine and fake of TREE (a checkout of main "
        "as it was: git worktree add /tmp/before <commit>), printed as 'before'",
    )
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    if args.before:
        argv = [a for a in sys.argv[1:] if a not in ("--before", args.before)]
        env = {**os.environ, "PYTHONPATH": str(Path(args.before).resolve())}
        print(f"== before: {args.before}", flush=True)
        subprocess.run([sys.executable, str(HERE), *argv], env=env, check=False)
        print("== after: this tree", flush=True)
    uniforms = {"realistic": (False,), "uniform": (True,), "both": (False, True)}[args.inputs]
    for uniform in () if args.skip_throughput else uniforms:
        for validate in (True, False):
            throughput(args.events, args.batch, args.threads, validate, uniform)
    if not args.skip_outage:
        outage(args.outage_s, args.rate)


if __name__ == "__main__":
    # run by path (the child processes): this tree last, so that PYTHONPATH picks the engine
    sys.path.append(str(HERE.parents[2]))
    main()
