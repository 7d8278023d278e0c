"""``tests/benchmarks/bench_round``'s canned Prometheus answers every query the engine asks
for the benchmark's policies, and refuses one it does not know (a rule edit must not make it
answer one policy's query as another's, silently changing the workload the figures are
measured on)."""

from __future__ import annotations

import pytest

from tests.benchmarks import bench_round


def test_a_small_run_asks_only_what_the_canned_server_knows() -> None:
    """A 400-GPU run through the fire and churn rounds: every query answered (a refused one
    fails the run), the fire decided, the churn deciding again after it."""
    r = bench_round.run(400, 6, None, churn=0.05)
    assert r["fire_decisions"] > 0
    assert r["after_fire"] > 0  # stay churn: targets fire and clear after the fire round


@pytest.mark.parametrize(
    "expr",
    [
        "nvml_gpu_memory_used_bytes > 0",  # no kind
        'up{job="gpu-nodes"} == 0 and on () gpuops_queue_pending_jobs > 0',  # two kinds
    ],
)
def test_a_query_of_no_kind_or_two_is_refused(expr: str) -> None:
    with pytest.raises(bench_round.UnknownQuery, match="of the canned answers"):
        bench_round.kind_of(expr)
