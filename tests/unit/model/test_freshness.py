"""Fresh data only, the pure half: targets whose input series are stale have no data (the
others are judged), and an outage longer than ``max_gap_s`` starts a pending ``for`` again.
The real-Prometheus half, which finds the stale series, is
tests/integration/runtime/test_freshness_prometheus.py."""

from __future__ import annotations

from gpuops.model.decisions import ActionSpec, Sample, freeze
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.state import PolicyState, Status
from gpuops.model.evaluation.step import Freshness, QueryResult
from gpuops.model.rules.loader import load_rules_text
from gpuops.model.rules.model import Policy
from gpuops.model.staleness import StaleInput
from gpuops.settings import PrometheusSettings
from gpuops.sources.promql import input_selectors, join_labels, stale_expr

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


def stale(age: float, **labels: str) -> StaleInput:
    """``util``'s series with ``labels`` read past the bound (``age`` seconds old)."""
    return StaleInput("util{}", (Sample(freeze({"gpuops_input": "0", **labels}), age, 0.0),))


def seen(age: float | None = None, *uuids: str) -> QueryResult:
    """``util`` below 0.2 for GPUs ``uuids`` (default: "a"); ``age``: every series that old,
    stale (the probe finds those older than the bound)."""
    uuids = uuids or ("a",)
    samples = tuple(Sample(freeze({"uuid": u}), 0.1, 0.0) for u in uuids)
    if age is None or age <= FRESH.max_sample_age_s:
        return QueryResult(samples)
    return QueryResult(samples, stale=tuple(stale(age, uuid=u) for u in uuids))


DOWN = QueryResult(error="Prometheus at http://x unreachable: connection refused")


def fires(steps: list[tuple[float, QueryResult]], policy: Policy = POLICY) -> list[float]:
    """The times at which ``policy`` fires over ``steps`` (evaluated with ``FRESH``)."""
    state, out = PolicyState(), []
    for now, result in steps:
        step = evaluate(policy, result, state, now, FRESH)
        state = step.state
        out += [now for d in step.decisions]
    return out


def test_a_target_whose_input_is_stale_is_held_and_the_others_are_judged() -> None:
    state = evaluate(POLICY, seen(None, "a", "b"), PolicyState(), 0, FRESH).state
    result = QueryResult(
        (Sample(freeze({"uuid": "a"}), 0.1, 0.0), Sample(freeze({"uuid": "b"}), 0.1, 0.0)),
        stale=(stale(45.0, uuid="a", instance="n1:9400"),),
    )
    step = evaluate(POLICY, result, state, 60, FRESH)
    assert [d.target.labels["uuid"] for d in step.decisions] == ["b"]
    assert step.state.targets["uuid=a"].status is Status.PENDING
    assert step.state.targets["uuid=a"].absent_since == 60  # a stretch without fresh data
    assert step.skipped is not None and step.skipped.reason == "stale data"
    assert step.skipped.error == (
        "stale data: util{}: 1 series with no sample in the last 30s, the oldest 45.0s old:"
        " 1 target held (uuid=a); the others were evaluated"
    )


def test_a_stale_series_without_target_labels_holds_every_target() -> None:
    state = evaluate(POLICY, seen(None, "a", "b"), PolicyState(), 0, FRESH).state
    result = QueryResult(seen(None, "a", "b").samples, stale=(stale(45.0, job="queue"),))
    step = evaluate(POLICY, result, state, 60, FRESH)
    assert step.decisions == ()
    assert step.skipped is not None and step.skipped.error == (
        "stale data: util{}: 1 series with no sample in the last 30s, the oldest 45.0s old"
    )


def test_a_firing_target_on_stale_input_is_neither_cleared_nor_undone() -> None:
    policy = Policy(
        name="cap",
        group="g",
        expr="util < 0.2",
        clear_expr="util > 0.5",
        action=ActionSpec("downclock", "fleet"),
        on_clear=ActionSpec("restore_clocks", "fleet"),
        target=("uuid",),
        mode="enforce",
    )
    state = evaluate(policy, seen(), PolicyState(), 0, FRESH).state
    assert state.targets["uuid=a"].status is Status.FIRING
    # the clear expression matches on the dead exporter's last samples: no undo on them
    cleared = (Sample(freeze({"uuid": "a"}), 0.9, 0.0),)
    step = evaluate(
        policy, QueryResult((), cleared, stale=(stale(60.0, uuid="a"),)), state, 30, FRESH
    )
    assert step.decisions == () and step.state.targets["uuid=a"].status is Status.FIRING
    step = evaluate(policy, QueryResult((), cleared), step.state, 60, FRESH)  # fresh again
    assert [d.transition.value for d in step.decisions] == ["clear"]


def test_without_target_labels_a_series_is_matched_on_the_labels_it_shares() -> None:
    policy = Policy(name="p", group="g", expr="util < 0.2", action=ActionSpec("reclaim", "fleet"))
    two = QueryResult(
        (
            Sample(freeze({"uuid": "a", "node": "n1"}), 0.1, 0.0),
            Sample(freeze({"uuid": "b", "node": "n2"}), 0.1, 0.0),
        ),
        stale=(stale(45.0, node="n2", instance="n2:9400"),),
    )
    step = evaluate(policy, two, PolicyState(), 0, FRESH)
    assert [d.target.labels["uuid"] for d in step.decisions] == ["a"]


def test_a_stale_series_of_a_target_not_in_the_answer_holds_nothing() -> None:
    result = QueryResult(seen().samples, stale=(stale(45.0, uuid="gone"),))
    step = evaluate(POLICY, result, PolicyState(), 0, FRESH)
    assert step.skipped is None and step.state.targets["uuid=a"].status is Status.PENDING


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


def test_no_bounds_act_on_every_answer() -> None:
    state = evaluate(POLICY, seen(), PolicyState(), 0).state
    for now in (10, 20, 500):
        state = evaluate(POLICY, DOWN, state, now).state
    assert len(evaluate(POLICY, seen(), state, 600).decisions) == 1  # backtests


def test_the_probe_asks_each_input_over_the_window_it_is_read_over() -> None:
    expr = (
        'avg_over_time(util{node="a"}[5m]) < 0.2 and on (uuid) mem offset 1m'
        " and on (uuid) max_over_time(rate(gpu[1m])[30m:1m]) > 0"
        ' and on (uuid) absent(up{job="x"}) and on () max_over_time(temp[10m:] @ 100) > 1'
    )
    inputs = input_selectors(expr)
    # a range selector over its range; one in a subquery over both ranges; an instant one in
    # a subquery over the subquery's range and Prometheus' lookback; offset and @: the past
    assert inputs == ('util{node="a"}[300s]', "gpu{}[1860s]", 'up{job="x"}')
    assert stale_expr(inputs, 30.0) == (
        'label_replace(last_over_time(util{node="a"}[300s]) unless'
        ' last_over_time(util{node="a"}[30s]), "gpuops_input", "0", "", "")'
        " or label_replace(last_over_time(gpu{}[1860s]) unless last_over_time(gpu{}[30s]),"
        ' "gpuops_input", "1", "", "")'
        ' or label_replace(time() - timestamp(up{job="x"}) > 30.0, "gpuops_input", "2", "", "")'
    )
    assert input_selectors("max_over_time(rate(x[1m])[5m:])") == ("x{}[360s]",)
    assert input_selectors("max_over_time(x[5m:])") == ("x{}[600s]",)
    # a window no longer than the bound cannot read a stale sample: not asked
    assert stale_expr(("x{}[20s]",), 30.0) is None
    assert stale_expr(("x{}[1500ms]",), 1.0) is not None
    assert stale_expr(input_selectors("vector(1)"), 30.0) is None
    assert stale_expr(("x{}",), float("inf")) is None  # no bound (backtests)


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


def test_without_target_labels_a_join_on_labels_ties_a_series_of_another_job() -> None:
    """``and on (uuid) alloc == 1``: the allocation series comes from another job (its
    ``instance`` and ``job`` differ from the utilization's), and still holds its GPU."""
    expr = "max_over_time(util[30m]) < 0.2 and on (uuid) alloc == 1"
    policy = Policy(name="p", group="g", expr=expr, action=ActionSpec("reclaim", "fleet"))
    on, ignoring = join_labels((expr,))
    assert (on, ignoring) == (frozenset({"uuid"}), frozenset())
    old = Sample(freeze({"job": "slurm", "instance": "s:9100", "uuid": "GPU-3"}), 120.0, 0.0)
    result = QueryResult(
        tuple(
            Sample(freeze({"job": "nvml", "instance": f"n{i}:9400", "uuid": f"GPU-{i}"}), 0.1, 0)
            for i in (2, 3)
        ),
        stale=(StaleInput("alloc{}", (old,), on, ignoring),),
    )
    step = evaluate(policy, result, PolicyState(), 0, FRESH)
    assert [d.target.labels["uuid"] for d in step.decisions] == ["GPU-2"]
    assert step.skipped is not None and "uuid=GPU-3" in step.skipped.error
