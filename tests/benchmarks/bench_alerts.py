"""The Alertmanager inbox at fleet scale: one notification of N firing alerts on N targets (one
GPU each) handed to ``AlertInbox.submit``, with the real SQLite state file, the real fsync'd
audit spool and a no-op executor, as ``gpuops engine run`` handles them; then a small urgent
group submitted behind a large one.

Prints, per group size: alerts per second until every alert is handled (decided, stored, its
intent audited: the inbox's work), the rate over its last 1,000 alerts (the cost of an alert
once that many targets were acted on, which the guardrail windows remember), the time until
every action's outcome is audited (the gate's work, on its executor's pool); then how long a
one-alert group submitted behind a large one waits for its action. Never fails on noise.

Run: ``python -m tests.benchmarks.bench_alerts [--targets 2000 10000] [--urgent-behind 10000]``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuops.model.alerts import Alert, AlertStatus
from gpuops.model.decisions import Decision, Outcome, freeze
from gpuops.runtime import collect_less
from gpuops.settings import ApiSettings
from tests.builders import build_engine

RULES = """
groups:
  - name: bench
    interval: 1h
    rules:
      - policy: drain-hot-gpus
        trigger: {alertmanager: {alertname: GpuHot}}
        target: [node, uuid]
        action: {type: reclaim, executor: log}
        cooldown: 1h
        limits: {max_per_hour: 1000000}
        mode: enforce
      - policy: drain-on-gpu-fell-off-bus
        trigger: {alertmanager: {alertname: GPUFellOffBus}}
        target: [node]
        action: {type: migrate, executor: log}
        mode: enforce
"""


class Noop:
    name = "log"
    verbs: frozenset[str] | None = None

    def __init__(self, settings: Mapping[str, Any]) -> None:
        pass

    def run(self, decision: Decision) -> Mapping[str, Any]:
        return {}


def alert(name: str, i: int) -> Alert:
    labels = {"alertname": name, "node": f"node-{i // 8}", "uuid": f"GPU-{i:08d}"}
    return Alert(
        fingerprint=f"{name}-{i:012x}"[-16:],
        status=AlertStatus.FIRING,
        labels=freeze(labels),
        annotations=freeze({"summary": f"GPU {i} is hot"}),
        starts_at="2030-01-01T00:00:00Z",
        ends_at="0001-01-01T00:00:00Z",
    )


class Run:
    """An engine on a fresh state file and spool, counting alerts handled and outcomes."""

    def __init__(self, workdir: Path, queue_size: int) -> None:
        self.outcomes: dict[str, float] = {}  # policy -> time of its last outcome
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.engine = build_engine(
            workdir,
            {"bench.yaml": RULES},
            prometheus="http://unused",
            executors={"log": Noop},
            listener=self._listener,
            api=ApiSettings(alert_queue_size=queue_size),
            reload=False,  # Engine.start loads them
        )
        self.engine.start()

    def _listener(self, decision: Decision, outcome: Outcome | None) -> None:
        if outcome is not None:
            with self._lock:
                self.outcomes[decision.policy] = time.perf_counter()
                self.counts[decision.policy] = self.counts.get(decision.policy, 0) + 1

    def handled(self) -> float:
        value = self.engine.metrics.registry.get_sample_value(
            "gpuops_api_alerts_total", {"result": "handled"}
        )
        return value or 0.0

    def stop(self) -> None:
        self.engine.stop()


def one_group(workdir: Path, targets: int) -> tuple[float, float, float]:
    """alerts/s overall, alerts/s over the last 1,000, seconds until all outcomes audited."""
    run = Run(workdir, max(10_000, targets))
    try:
        group = [alert("GpuHot", i) for i in range(targets)]
        tail = max(0, targets - 1_000)
        marks: dict[str, float] = {}
        started = time.perf_counter()
        run.engine.alerts.submit(group)
        while run.handled() < targets:
            if "tail" not in marks and run.handled() >= tail:
                marks["tail"] = time.perf_counter()
            time.sleep(0.005)
        assert run.engine.alerts.wait_idle(3600)
        handled = time.perf_counter()
        run.engine.wait_idle(3600)
        while run.counts.get("drain-hot-gpus", 0) < targets:
            time.sleep(0.005)
        audited = run.outcomes["drain-hot-gpus"] - started
        last = (targets - tail) / max(handled - marks.get("tail", started), 1e-9)
        return targets / (handled - started), last, audited
    finally:
        run.stop()


def urgent_behind(workdir: Path, large: int) -> tuple[float, float]:
    """A GPUFellOffBus alert submitted just after a GpuHot group of ``large``: seconds until
    its action's outcome is audited, and until the large group is handled."""
    run = Run(workdir, max(10_000, large + 1))
    try:
        run.engine.alerts.submit([alert("GpuHot", i) for i in range(large)])
        started = time.perf_counter()
        run.engine.alerts.submit([alert("GPUFellOffBus", 7)])
        while "drain-on-gpu-fell-off-bus" not in run.outcomes:
            time.sleep(0.002)
        urgent = run.outcomes["drain-on-gpu-fell-off-bus"] - started
        assert run.engine.alerts.wait_idle(3600)
        return urgent, time.perf_counter() - started
    finally:
        run.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=int, nargs="+", default=[2_000, 10_000])
    parser.add_argument("--urgent-behind", type=int, default=10_000)
    args = parser.parse_args()
    collect_less()  # as ``gpuops engine run`` does
    for targets in args.targets:
        with tempfile.TemporaryDirectory() as tmp:
            rate, last, audited = one_group(Path(tmp), targets)
        print(
            f"{targets:6d} alerts on {targets} targets: {rate:8.1f} alerts/s handled, "
            f"{last:8.1f} alerts/s over the last 1,000, all outcomes audited after "
            f"{audited:6.1f} s",
            flush=True,
        )
    if args.urgent_behind:
        with tempfile.TemporaryDirectory() as tmp:
            urgent, large = urgent_behind(Path(tmp), args.urgent_behind)
        print(
            f"1 GPUFellOffBus alert behind {args.urgent_behind} GpuHot alerts: its outcome "
            f"audited after {urgent:.2f} s; the large group handled after {large:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
