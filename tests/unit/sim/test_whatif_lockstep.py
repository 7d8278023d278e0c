"""The what-if's engine side without a fleet: the lockstep Prometheus client (a query asked
again at the same instant is answered once; prefetched queries are what the cycle asks) and
the scrape-interval check of the policies' windows."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

import pytest
import requests
import responses

from gpuops.actions.registry import ExecutorRegistry
from gpuops.model.decisions import Sample
from gpuops.model.rules.loader import load_rules_text
from gpuops.model.rules.model import Group, RuleSet
from gpuops.runtime import Engine
from gpuops.settings import HealthSettings
from gpuops.sim.whatif.errors import WhatifError
from gpuops.sim.whatif.lockstep import LockstepPrometheus
from gpuops.sim.whatif.loop import PolicyLoop, VirtualClock, group_queries
from gpuops.sim.whatif.queries import check_windows, windows
from gpuops.sources import QueryError
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promql import stale_expr
from tests.builders import build_engine

REPO = Path(__file__).resolve().parents[3]
URL = "http://prom.test"
QUERY = f"{URL}/api/v1/query"


def _vector(value: float) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"a": "1"}, "value": [1, str(value)]}],
        },
    }


@pytest.fixture
def client() -> Iterator[LockstepPrometheus]:
    session = requests.Session()
    session.trust_env = False
    c = LockstepPrometheus(URL, session)
    yield c
    c.close()


@responses.activate
def test_a_query_asked_again_at_the_same_instant_is_asked_once(client: LockstepPrometheus) -> None:
    responses.get(QUERY, json=_vector(1.0))
    responses.post(QUERY, json=_vector(1.0))
    first = client.query("up", at=100.0)
    again = client.query("up", at=100.0)
    assert first == again and first[0].value == 1.0
    assert len(responses.calls) == 1
    client.query("up", at=130.0)  # the next instant asks again
    assert len(responses.calls) == 2
    assert (client.asked, client.answered) == (3, 1)


@responses.activate
def test_groups_at_two_instants_in_one_step_keep_each_others_answers(
    client: LockstepPrometheus,
) -> None:
    """A step off the whole minute: interval groups ask at ``now``, cron groups at
    ``cron_time(now)``, interleaved; each instant's answers and prefetches are kept until the
    step ends (``forget``)."""
    responses.get(QUERY, json=_vector(1.0))
    responses.post(QUERY, json=_vector(1.0))
    client.prefetch(["up", "load"], at=90.0)
    client.prefetch(["cron"], at=60.0)
    for expr, at in [("up", 90.0), ("cron", 60.0), ("load", 90.0), ("cron", 60.0)]:
        client.query(expr, at=at)
    assert len(responses.calls) == 3
    assert (client.asked, client.answered) == (4, 4)
    client.forget()  # the next step
    client.query("up", at=90.0)
    assert len(responses.calls) == 4


@responses.activate
def test_a_failed_query_is_not_kept(client: LockstepPrometheus) -> None:
    responses.get(QUERY, status=503, body="overloaded")
    responses.post(QUERY, status=503, body="overloaded")
    for _ in range(2):
        with pytest.raises(QueryError):
            client.query("up", at=100.0)
    assert len(responses.calls) >= 2  # asked again, not answered from the failure


class _Recording(PrometheusClient):
    """A Prometheus client that records the instant queries asked of it (no series)."""

    def __init__(self) -> None:
        super().__init__("http://unused")
        self.asked: list[str] = []
        self._lock = threading.Lock()

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        with self._lock:
            self.asked.append(expr)
        return ()


CRON = """
groups:
  - name: nightly
    interval: 30s
    rules:
      - policy: busy
        expr: avg_over_time(nvml_gpu_utilization_ratio[5m]) > 0.9
        clear_expr: avg_over_time(nvml_gpu_utilization_ratio[5m]) < 0.5 or gpuops_gpu_shared
        target: [uuid]
        action: {type: downclock, executor: log}
      - policy: nightly-reclaim
        schedule: "0 2 * * *"
        expr: max_over_time(nvml_gpu_utilization_ratio[1h]) < 0.05 and on(uuid) gpuops_gpu_up
        target: [uuid]
        action: {type: reclaim, executor: log}
"""


def test_prefetched_queries_are_those_a_real_cycle_asks(tmp_path: Path) -> None:
    (tmp_path / "cron.yaml").write_text(CRON)
    rules = [REPO / "rules" / "gpu-efficiency.yaml", REPO / "rules" / "fleet"]
    rules.append(tmp_path / "cron.yaml")
    recording = _Recording()
    engine = build_engine(
        tmp_path, rules, source=recording, clock=lambda: 7200.0, executors=ExecutorRegistry()
    )
    try:
        runs = [(g, s) for g in engine.rules.groups for s in (False, True)]
        assert any(s and any(p.schedule for p in g.policies) for g, s in runs)
        for group, scheduled in runs:
            recording.asked.clear()
            engine.evaluate_group(group, scheduled)
            bound = engine.config.prometheus.freshness(group.interval_s).max_sample_age_s
            prefetched = list(group_queries(group, scheduled, bound))
            assert sorted(prefetched) == sorted(recording.asked), (group.name, scheduled)
    finally:
        engine.stop()


def test_windows_are_every_range_and_subquery() -> None:
    expr = "avg_over_time(x[10m]) and max_over_time(rate(y[1m])[5m:30s]) and z offset 20m"
    assert sorted(windows(expr)) == [60.0, 300.0, 600.0]


def test_a_window_that_holds_fewer_than_two_samples_is_refused() -> None:
    rules = load_rules_text(
        "groups:\n"
        "  - name: g\n"
        "    interval: 30s\n"
        "    rules:\n"
        "      - policy: busy\n"
        "        expr: avg_over_time(nvml_gpu_utilization_ratio[2m]) > 0.9\n"
        "        target: [uuid]\n"
        "        action: {type: reclaim, executor: log}\n",
        "w.yaml",
    )
    engine = cast(Any, SimpleNamespace(rules=rules))
    check_windows(engine, 60.0)  # [2m] holds two samples at 60 s
    with pytest.raises(WhatifError) as error:
        check_windows(engine, 90.0)
    assert str(error.value) == (
        "w.yaml:6: policy busy, expr: reads a 120 s window, which holds fewer than two samples "
        "at a scrape interval of 90 s: use a scrape interval of at most 60 s"
    )


def _policy(expr: str, extra: str = "") -> str:
    return (
        "groups:\n  - name: g\n    interval: 30s\n    rules:\n"
        f"      - policy: p\n        expr: {json.dumps(expr)}\n"
        f"        action: {{type: reclaim, executor: log}}\n{extra}"
    )


def _read_names(rules: Any) -> set[str]:
    """The names of every vector selector of each policy's queries (its population's too),
    read from the parse trees."""
    import promql_parser

    from gpuops.model.guardrails import population_expr

    found: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            named = [m.value for m in node.matchers.matchers if m.name == "__name__"]
            found.add(node.name or named[0])
        return True

    for policy in rules.policies():
        population = population_expr(policy) if policy.max_fraction is not None else None
        for expr in (policy.expr, policy.clear_expr, population):
            if expr is not None:
                promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_the_run_writes_the_metrics_its_rules_read(tmp_path: Path) -> None:
    from gpuops.model.rules.loader import load_rules
    from gpuops.sim.whatif.queries import metric_names

    shipped = [REPO / "rules" / "gpu-efficiency.yaml", REPO / "rules" / "energy"]
    loaded = load_rules([*shipped, REPO / "rules" / "fleet"])
    written = metric_names(loaded)
    assert written is not None
    # every metric name a query of the loaded policies reads, whatever rules the directories
    # hold (a new fleet rule adds its own): expr, clear_expr and the population query
    assert written == _read_names(loaded)
    assert written >= {  # the shipped rules' metrics, known to be among them
        "nvml_gpu_utilization_ratio",
        "gpuops_gpu_allocated",
        "gpuops_gpu_shared_jobs",
        "up",  # power-down-idle-nodes, also `offset 10m`
        "gpuops_queue_scale_demand_jobs",
        "gpuops_queue_borrow_demand_jobs",
        "gpuops_priority_class_held",
        "gpuops_electricity_price_per_kwh",
        "gpuops_electricity_off_peak_price_per_kwh",
    }
    assert "nvml_gpu_temperature_celsius" not in written  # the fleet writes it, no rule reads it
    path = tmp_path / "p.yaml"

    def names(expr: str, extra: str = "") -> frozenset[str] | None:
        path.write_text(_policy(expr, extra))
        return metric_names(load_rules([path]))

    population = (
        "        target: [node]\n        limits: {max_fraction: 0.5, population: 'c offset 5m'}\n"
    )
    assert names("a > 1", "        clear_expr: b < 1\n" + population) == {"a", "b", "c"}
    assert names('{__name__="a", x="1"} > 1') == {"a"}
    # a selector without a name, or a population that may read any series: every series
    assert names('{__name__=~"a|b"} > 1') is None
    assert names("a > 1", "        limits: {max_fraction: 0.5}\n") is None  # no target
    assert (
        names(
            'label_replace(a, "node", "$1", "n", "(.*)") > 1',
            "        target: [node]\n        limits: {max_fraction: 0.5}\n",
        )
        is None
    )


@responses.activate
def test_the_groups_age_probes_are_asked_as_one(client: LockstepPrometheus) -> None:
    """Two groups' probes share a selector: one probe of the three selectors is asked, and
    each group's probe is answered from it with its own numbering (a selector without stale
    series is absent from both)."""
    from gpuops.sources.promql import AGE_LABEL

    def ages(request: Any) -> tuple[int, dict[str, str], str]:
        asked = request.params["query"] if request.params else ""
        assert asked == stale_expr(("util", "alloc", "shared"), 30.0), asked
        result = [
            {"metric": {AGE_LABEL: "0", "uuid": "a"}, "value": [100, "12"]},  # util
            {"metric": {AGE_LABEL: "2", "uuid": "b"}, "value": [100, "7"]},  # shared
        ]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return 200, {}, json.dumps(body)

    responses.add_callback(responses.GET, QUERY, callback=ages)
    responses.add_callback(responses.POST, QUERY, callback=ages)
    probes = [(("util", "alloc"), 30.0), (("shared", "util"), 30.0), (("util", "alloc"), 30.0)]
    client.prefetch_ages(probes, at=100.0)

    def stale(inputs: tuple[str, ...]) -> dict[str, list[tuple[str, float]]]:
        found = client.stale_series(inputs, 30.0, at=100.0)
        return {i: [(s.labels["uuid"], s.value) for s in series] for i, series in found.items()}

    assert stale(("util", "alloc")) == {"util": [("a", 12.0)]}
    assert stale(("shared", "util")) == {"shared": [("b", 7.0)], "util": [("a", 12.0)]}
    assert len(responses.calls) == 1
    assert (client.asked, client.answered) == (2, 2)


@responses.activate
def test_a_failed_shared_probe_is_asked_again_by_each_group(client: LockstepPrometheus) -> None:
    """A group that asks while the shared probe is still in flight gets its failure (the
    cycle's prefetch, which then leaves it to each policy's own ask); whoever asks after
    that asks the group's own probe. Which of the two a group's first ask meets depends on
    the background thread (the test counted calls after one ask each and failed under load),
    so each group asks twice: its own probe is asked in either case."""
    responses.get(QUERY, status=503, body="overloaded")
    responses.post(QUERY, status=503, body="overloaded")
    client.prefetch_ages([(("a",), 30.0), (("b",), 30.0)], at=100.0)
    for selectors in (("a",), ("b",)):
        for _ in range(2):
            with pytest.raises(QueryError):
                client.stale_series(selectors, 30.0, at=100.0)
    asked = [parse_qs(urlparse(c.request.url or "").query)["query"][0] for c in responses.calls]
    assert asked.count(stale_expr(("a", "b"), 30.0)) == 1  # the shared probe, once
    for selectors in (("a",), ("b",)):
        assert stale_expr(selectors, 30.0) in asked  # then each group's own


def test_an_instants_groups_run_one_at_a_time_in_name_order_each_groups_actions_first() -> None:
    """The on run is reproducible per seed: group "a" and its actions before group "b",
    whatever order the rule files list them in (side by side, the order in which their
    actions reached the fleet varied from run to run)."""
    calls: list[str] = []

    class Stub:
        rules = RuleSet(groups=(Group("b", 30.0, ()), Group("a", 30.0, ())))

        def evaluate_group(self, group: Group, scheduled: bool) -> None:
            calls.append(f"evaluate {group.name}")

        def wait_idle(self, timeout: float) -> bool:
            calls.append("wait")
            return True

        def expire_approvals(self) -> None:
            pass

        class ladder:  # noqa: N801 - the engine's attribute
            @staticmethod
            def tick() -> None:
                calls.append("ladder")

        config = SimpleNamespace(health=HealthSettings())

    loop = PolicyLoop(cast(Engine, Stub()), VirtualClock(0.0))
    loop.evaluate(30.0)
    assert calls[:4] == ["evaluate a", "wait", "evaluate b", "wait"]
    assert calls[4:] == ["ladder", "wait"]  # the remediation ladder looks, its moves finish
