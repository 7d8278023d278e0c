"""The engine against VictoriaMetrics: the shipped policies' tests (rules/tests)
make the same decisions when a single-node VictoriaMetrics (MetricsQL) evaluates their PromQL as
when Prometheus 2.42 does — except where MetricsQL's range windows differ, documented in
docs/scaling.md and pinned here: a window ``[d]`` at time t holds the samples in (t - d, t],
Prometheus 2.x's [t - d, t] (Prometheus 3 changed to VictoriaMetrics' way). With samples exactly
on the evaluation grid, a condition that waits for a sample to leave the window holds one
evaluation earlier. And the engine's own client (queries, the freshness probe) works unchanged
against it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.offline.policytest import CaseResult, Seen, run_test_file
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promproc import VictoriaMetricsServer
from gpuops.sources.promql import input_selectors

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
FILES = sorted((ROOT / "rules" / "tests").glob("*.yaml"))
EARLIER = {  # (test, policy, transition): seconds VictoriaMetrics decides earlier
    ("an allocated GPU idle for 30 minutes", "reclaim-idle-gpus", "fire"): 30.0,
    ("an allocated GPU between 20% and 30%", "downclock-underused-gpus", "clear"): 30.0,
}


def shifted(result: CaseResult, seen: Seen) -> float:
    for (test, policy, transition), seconds in EARLIER.items():
        if result.name.startswith(test) and (seen.policy, seen.transition) == (policy, transition):
            return seconds
    return 0.0


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_the_shipped_policy_tests_decide_the_same_on_victoriametrics(path: Path) -> None:
    prometheus = run_test_file(path)
    victoria = run_test_file(path, backend="victoriametrics")
    assert all(r.ok for r in prometheus), [r.problems for r in prometheus]
    assert [r.name for r in victoria] == [r.name for r in prometheus]
    for on_prom, on_vm in zip(prometheus, victoria, strict=True):
        expected = [
            Seen(s.at - shifted(on_prom, s), s.policy, s.transition, s.target)
            for s in on_prom.decisions
        ]
        assert list(on_vm.decisions) == expected, on_prom.name
    assert len([s for r in prometheus for s in r.decisions]) >= 3  # the tests do decide


@pytest.fixture(scope="module")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetricsServer]:
    server = VictoriaMetricsServer(tmp_path_factory.mktemp("vm"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_engines_client_and_freshness_probe_work_against_victoriametrics(
    victoria: VictoriaMetricsServer,
) -> None:
    now = time.time()
    lines = [
        f'nvml_gpu_utilization_ratio{{node="n1",uuid="GPU-{i}"}} 0.1 {round((now - 20) * 1000)}'
        for i in range(3)
    ]
    victoria.import_text("\n".join(lines) + "\n")
    client = PrometheusClient(victoria.url)
    samples = client.query("max_over_time(nvml_gpu_utilization_ratio[5m]) < 0.2", at=now)
    assert sorted(s.labels["uuid"] for s in samples) == ["GPU-0", "GPU-1", "GPU-2"]
    inputs = input_selectors("max_over_time(nvml_gpu_utilization_ratio[5m]) < 0.2")
    stale = client.stale_series(inputs, 10.0, at=now)  # the newest sample is 20 s old
    assert sorted(s.labels["uuid"] for s in stale[inputs[0]]) == ["GPU-0", "GPU-1", "GPU-2"]
    assert client.stale_series(inputs, 30.0, at=now) == {}
