"""Fresh data only (issue 10, breakage 1), the pure half: stale results are no data, and an
outage longer than ``max_gap_s`` starts a pending ``for`` again. Both edges of both bounds.
The real-Prometheus half is tests/integration/test_freshness_prometheus.py."""

from __future__ import annotations

from engine.config import PrometheusSettings
from engine.decisions import ActionSpec, Sample, freeze
from engine.evaluation import Freshness, PolicyState, QueryResult, Status, evaluate
from engine.prometheus import age_expr
from engine.rules.loader import load_rules_text
from engine.rules.model import Policy

POLICY = Policy(
    name="reclaim",
    group="g",
    expr="util < 0.2",
    action=ActionSpec("reclaim", "fleet"),
    for_s=60,
    target=("uuid",),
    mode="enforce",
)
FRESH = Freshness(max_sample_age_s=30, max_gap_s=20)


def seen(age: float | None = 1.0) -> QueryResult:
    return QueryResult((Sample(freeze({"uuid": "a"}), 0.1, 0.0),), sample_age=age)


DOWN = QueryResult(error="Prometheus at http://x unreachable: connection refused")


def fires(steps: list[tuple[float, QueryResult]], policy: Policy = POLICY) -> list[float]:
    """The times at which ``policy`` fires over ``steps`` (evaluated with ``FRESH``)."""
    state, out = PolicyState(), []
    for now, result in steps:
        step = evaluate(policy, result, state, now, FRESH)
        state = step.state
        out += [now for d in step.decisions]
    return out


def test_a_sample_at_the_age_bound_is_acted_on_one_older_is_not() -> None:
    assert fires([(0, seen()), (60, seen(age=30.0))]) == [60]
    state = evaluate(POLICY, seen(), PolicyState(), 0, FRESH).state
    step = evaluate(POLICY, seen(age=30.5), state, 60, FRESH)
    assert step.decisions == ()
    assert step.skipped is not None and step.skipped.error == (
        "stale data: the oldest input sample is 30.5s old, more than max_sample_age 30s"
    )
    (pending,) = step.state.targets.values()
    assert pending.status is Status.PENDING and pending.active_since == 0


def test_an_outage_as_long_as_the_gap_bound_keeps_the_timer() -> None:
    # down from 10 to 30 (the first failed evaluation at 10, fresh again at 30: 20 s)
    assert fires([(0, seen()), (10, DOWN), (20, DOWN), (30, seen()), (60, seen())]) == [60]


def test_an_outage_longer_than_the_gap_bound_starts_for_again() -> None:
    steps = [(0, seen()), (10, DOWN), (20, DOWN), (31, seen()), (60, seen()), (91, seen())]
    assert fires(steps) == [91]  # `for: 60s` counted from 31, not from 0


def test_stale_evaluations_count_as_an_outage() -> None:
    old = seen(age=45.0)  # a restarted Prometheus serving what it had before it was killed
    steps = [(0, seen()), (10, old), (20, old), (40, old), (45, seen()), (60, seen())]
    assert fires(steps) == []  # would have fired at 60 on a timer that ran through the outage
    assert fires([*steps, (105, seen())]) == [105]


def test_time_without_evaluations_is_no_outage() -> None:
    # the engine was stopped from 10 to 50 (its state kept): no failed evaluation in between
    assert fires([(0, seen()), (50, seen()), (60, seen())]) == [60]


def test_an_unknown_age_and_no_bounds_act_as_before() -> None:
    assert fires([(0, seen(age=None)), (60, seen(age=None))]) == [60]
    state = evaluate(POLICY, seen(), PolicyState(), 0).state
    for now in (10, 20, 500):
        state = evaluate(POLICY, DOWN, state, now).state
    assert len(evaluate(POLICY, seen(age=1e9), state, 600).decisions) == 1  # backtests


def test_the_age_query_asks_for_each_selector_that_reads_the_present() -> None:
    expr = 'avg_over_time(util{node="a"}[5m]) < 0.2 and on (uuid) mem offset 1m'
    assert age_expr((expr, 'util{node="a"} > 0 unless up @ 100 or gpu', "vector(1)")) == (
        'max(label_replace(max(time() - timestamp(util{node="a"})), "gpuops_input", "0", "", "")'
        ' or label_replace(max(time() - timestamp(gpu{})), "gpuops_input", "1", "", ""))'
    )
    assert age_expr(("vector(1)",)) is None


def test_a_group_may_set_its_own_sample_age_bound() -> None:
    text = (
        "groups:\n  - name: over-recording-rules\n    interval: 1m\n    max_sample_age: 2m\n"
        "    rules:\n      - policy: p\n        expr: job:util:avg < 0.1\n"
        "        action: {type: notify, executor: log}\n"
    )
    (group,) = load_rules_text(text, "r.yaml").groups
    settings = PrometheusSettings(scrape_interval=15)
    assert settings.freshness(group.interval_s, group.max_sample_age_s) == Freshness(120, 120)
    assert settings.freshness(group.interval_s) == Freshness(30, 120)
