"""The engine's whole cycle at fleet scale: one ``Engine.evaluate_policy`` over a
10,000-target query result, with the real SQLite state file, the real fsync'd audit spool and a
no-op executor, so the figures include persistence, the audit and the action pool.

Prints: milliseconds of the cycle in which every target fires (10,000 decisions judged, stored
and handed to the actions), of a steady cycle (every target already acted on), the time until
every outcome is audited, and the median / p99 of decision -> audited latency (from the start of
the cycle that decided it to its outcome document in the spool). Never fails on noise.

Run: ``python -m tests.benchmarks.bench_cycle [--gpus 10000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuops.model.decisions import Decision, Outcome, Sample, freeze
from tests.builders import build_engine
from tests.fakes.prometheus import FakeSource

RULES = """
groups:
  - name: bench
    interval: 30s
    rules:
      - policy: reclaim-idle-gpus
        expr: idle
        for: 0s
        target: [node, uuid]
        action: {type: reclaim, executor: log}
        cooldown: 1h
        limits: {max_per_hour: 1000000}
        mode: enforce
"""


class Samples(FakeSource):
    """A Prometheus client that answers every query with the same ``gpus`` series."""

    def __init__(self, gpus: int) -> None:
        self.samples = tuple(
            Sample(freeze({"node": f"node-{i // 8}", "uuid": f"GPU-{i:08d}"}), 0.1, 0)
            for i in range(gpus)
        )

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        return self.samples


class Noop:
    name = "log"
    verbs: frozenset[str] | None = None

    def __init__(self, settings: Mapping[str, Any]) -> None:
        pass

    def run(self, decision: Decision) -> Mapping[str, Any]:
        return {}


def one_run(workdir: Path, gpus: int) -> tuple[float, float, float, list[float]]:
    audited: list[float] = []
    all_done = threading.Event()
    lock = threading.Lock()

    def listener(decision: Decision, outcome: Outcome | None) -> None:
        if outcome is None:
            return
        with lock:
            audited.append(time.perf_counter())
            if len(audited) == gpus:
                all_done.set()

    engine = build_engine(
        workdir,
        {"bench.yaml": RULES},
        source=Samples(gpus),
        executors={"log": Noop},
        listener=listener,
    )
    policy = engine.rules.policy("reclaim-idle-gpus")
    assert policy is not None
    try:
        started = time.perf_counter()
        decisions = engine.evaluate_policy(policy)
        fire_ms = (time.perf_counter() - started) * 1000
        assert len(decisions) == gpus, len(decisions)
        all_done.wait(600)
        done_ms = (time.perf_counter() - started) * 1000
        engine.wait_idle(600)
        steady_started = time.perf_counter()
        assert engine.evaluate_policy(policy) == []
        steady_ms = (time.perf_counter() - steady_started) * 1000
        latencies = [(t - started) * 1000 for t in audited]
        return fire_ms, steady_ms, done_ms, latencies
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    fires, steadies, dones, medians, p99s = [], [], [], [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            fire, steady, done, lat = one_run(Path(tmp), args.gpus)
        lat.sort()
        median, p99 = statistics.median(lat), lat[int(len(lat) * 0.99) - 1]
        fires.append(fire)
        steadies.append(steady)
        dones.append(done)
        medians.append(median)
        p99s.append(p99)
        print(
            f"run {i + 1}: fire cycle {fire:8.1f} ms, steady cycle {steady:7.1f} ms, "
            f"all audited {done:8.1f} ms, decision -> audited median {median:8.1f} ms "
            f"p99 {p99:8.1f} ms"
        )
    print(
        f"targets: {args.gpus}; median of {args.runs} runs: fire cycle "
        f"{statistics.median(fires):.1f} ms, steady cycle {statistics.median(steadies):.1f} ms, "
        f"all audited {statistics.median(dones):.1f} ms, decision -> audited median "
        f"{statistics.median(medians):.1f} ms, p99 {statistics.median(p99s):.1f} ms"
    )


if __name__ == "__main__":
    main()
