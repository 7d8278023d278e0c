"""Evaluation cycle at fleet scale: the pure evaluation and the
guardrails for one policy over a large query result, and the SQLite persistence of the state.

Run: ``python -m tests.benchmarks.bench_evaluation [--gpus 10000]``. Prints milliseconds per
cycle (steady state: every target already pending), per fire cycle (every target fires and is
judged) and per persisted state, and the peak RSS. Never fails on noise.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from gpuops.model.decisions import ActionSpec, Sample, freeze
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.evaluation.step import QueryResult
from gpuops.model.guardrails import Context, GuardrailState, judge_all
from gpuops.model.rules.model import Policy
from gpuops.store.sqlite import StateStore

POLICY = Policy(
    name="reclaim-idle-gpus",
    group="bench",
    expr="x",
    action=ActionSpec("reclaim", "fleet"),
    for_s=600,
    target=("node", "uuid"),
    cooldown_s=3600,
    max_per_hour=1_000_000,
    mode="enforce",
)


def samples(gpus: int) -> tuple[Sample, ...]:
    return tuple(
        Sample(
            freeze({"node": f"node-{i // 8}", "uuid": f"GPU-{i:08d}", "gpu": str(i % 8)}), 0.1, 0
        )
        for i in range(gpus)
    )


def per_call(fn: object, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - started) / repeat * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    result = QueryResult(samples(args.gpus))
    pending = evaluate(POLICY, result, PolicyState(), 0).state

    steady = per_call(lambda: evaluate(POLICY, result, pending, 30), args.repeat)
    fire_step = evaluate(POLICY, result, pending, 600)

    def judge_cycle() -> None:
        judge_all(fire_step.decisions, POLICY, GuardrailState(), Context(population=args.gpus), 600)

    fire = per_call(lambda: evaluate(POLICY, result, pending, 600), args.repeat)
    judged = per_call(judge_cycle, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp) / "state.sqlite")

        def persist() -> None:
            with store.transaction() as db:
                store.save_policy_state(db, POLICY.name, fire_step.state)

        saved = per_call(persist, args.repeat)
        loaded = per_call(lambda: store.policy_state(POLICY.name), args.repeat)
        store.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"targets: {args.gpus}")
    print(f"evaluate, all pending (steady state): {steady:8.1f} ms/cycle")
    print(f"evaluate, all fire:                    {fire:8.1f} ms/cycle")
    print(f"guardrails, judge {len(fire_step.decisions)} decisions:       {judged:8.1f} ms")
    print(f"persist state (SQLite, fsync):         {saved:8.1f} ms")
    print(f"load state:                            {loaded:8.1f} ms")
    print(f"peak RSS:                              {rss:8.1f} MiB")


if __name__ == "__main__":
    main()
