"""The guardrails' verdicts, each suppression with its reason, and the state they keep."""

from __future__ import annotations

import json
from dataclasses import replace

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Sample,
    Target,
    Transition,
    decision_id,
    freeze,
)
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.evaluation.step import QueryResult
from gpuops.model.guardrails import Context, GuardrailState, judge, judge_step
from gpuops.model.rules.model import Policy

POLICY = Policy(
    name="reclaim",
    group="g",
    expr="x",
    action=ActionSpec("reclaim", "fleet"),
    target=("uuid",),
    mode="enforce",
    cooldown_s=600,
)


def fire(
    target: str, policy: Policy = POLICY, transition: Transition = Transition.FIRE
) -> Decision:
    t = Target(f"uuid={target}", freeze({"uuid": target}))
    return Decision(
        id=decision_id(policy.name, t.key, 0, transition.value),
        policy=policy.name,
        group="g",
        target=t,
        transition=transition,
        action=policy.action if transition is Transition.FIRE else policy.on_clear,
        evidence=Evidence("x", 0.1, 0, 0),
        at=0,
        episode_start=0,
    )


def verdicts(
    policy: Policy, targets: list[tuple[float, str]], ctx: Context | None = None
) -> list[str]:
    state = GuardrailState()
    out = []
    for now, target in targets:
        decision, state = judge(fire(target, policy), policy, state, ctx or Context(), now)
        out.append(decision.verdict)
    return out


def test_execute_by_default_in_enforce_mode() -> None:
    assert verdicts(POLICY, [(0, "a")]) == ["execute"]


def test_dry_run_policy_and_engine() -> None:
    assert verdicts(replace(POLICY, mode="dry-run"), [(0, "a")]) == ["dry_run"]
    assert verdicts(POLICY, [(0, "a")], Context(engine_dry_run=True)) == ["dry_run"]


def test_dry_run_does_not_start_a_cooldown() -> None:
    policy = replace(POLICY, mode="dry-run")
    assert verdicts(policy, [(0, "a"), (10, "a")]) == ["dry_run", "dry_run"]


def test_cooldown_per_target() -> None:
    got = verdicts(POLICY, [(0, "a"), (100, "a"), (100, "b"), (601, "a")])
    assert got == ["execute", "suppressed:cooldown", "execute", "execute"]


def test_cooldown_reason_says_how_long_is_left() -> None:
    state = GuardrailState()
    _, state = judge(fire("a"), POLICY, state, Context(), 0)
    decision, _ = judge(fire("a"), POLICY, state, Context(), 100)
    assert decision.reason == "cooldown 600s: last action on this target 100s ago, 500s left"


def test_max_per_hour_window_slides() -> None:
    policy = replace(POLICY, max_per_hour=2, cooldown_s=0)
    got = verdicts(policy, [(0, "a"), (10, "b"), (20, "c"), (3601, "d")])
    assert got == ["execute", "execute", "suppressed:max_per_hour", "execute"]


def test_max_fraction_of_population() -> None:
    # a policy matching 6 of 10 GPUs with max_fraction 0.1 acts on 1 of them
    policy = replace(POLICY, max_fraction=0.1, cooldown_s=0)
    got = verdicts(policy, [(0, t) for t in "abcdef"], Context(population=10))
    assert got == ["execute"] + ["suppressed:max_fraction"] * 5
    got = verdicts(
        replace(policy, max_fraction=0.25), [(0, t) for t in "abcdef"], Context(population=10)
    )
    assert got.count("execute") == 2


def test_max_fraction_without_population_suppresses() -> None:
    policy = replace(POLICY, max_fraction=0.5)
    assert verdicts(policy, [(0, "a")], Context(population=None)) == ["suppressed:max_fraction"]


def test_global_budget() -> None:
    policy = replace(POLICY, cooldown_s=0)
    got = verdicts(policy, [(0, "a"), (1, "b"), (2, "c")], Context(global_max_per_hour=2))
    assert got == ["execute", "execute", "suppressed:global_budget"]


def test_kill_switch_and_pause_suppress_everything_including_undo() -> None:
    clear = fire(
        "a", replace(POLICY, on_clear=ActionSpec("restore_clocks", "fleet")), Transition.CLEAR
    )
    d, _ = judge(clear, POLICY, GuardrailState(), Context(kill_switch=True), 0)
    assert d.verdict == "suppressed:kill_switch"
    d, _ = judge(fire("a"), POLICY, GuardrailState(), Context(paused=True), 0)
    assert d.verdict == "suppressed:paused"


def test_undo_passes_cooldown_and_limits() -> None:
    policy = replace(POLICY, on_clear=ActionSpec("restore_clocks", "fleet"), max_per_hour=1)
    state = GuardrailState()
    _, state = judge(fire("a", policy), policy, state, Context(), 0)
    d, _ = judge(fire("a", policy, Transition.CLEAR), policy, state, Context(), 1)
    assert d.verdict == "execute"


def test_approval_required_waits_until_granted() -> None:
    policy = replace(POLICY, approval="required")
    assert verdicts(policy, [(0, "a")]) == ["awaiting_approval"]
    assert verdicts(policy, [(0, "a")], Context(approved=True)) == ["execute"]


def test_population_of_a_policy_without_target_uses_its_targets_labels() -> None:
    from gpuops.model.guardrails import population_expr

    policy = replace(POLICY, target=None, max_fraction=0.25)
    expr = population_expr(policy, {"node", "job", "__name__"})
    assert expr == 'group by (job, node) (x{job!="",node!=""})'
    assert population_expr(replace(policy, population="up")) == "up"
    assert population_expr(replace(policy, max_fraction=None)) is None
    assert population_expr(POLICY) is None  # no max_fraction
    assert population_expr(replace(POLICY, max_fraction=0.5)) == 'group by (uuid) (x{uuid!=""})'


def population(expr: str, target: tuple[str, ...] = ("node", "uuid")) -> str | None:
    from gpuops.model.guardrails import population_expr

    return population_expr(replace(POLICY, expr=expr, target=target, max_fraction=0.1))


def test_population_counts_the_targets_of_the_series_the_results_come_from() -> None:
    # the shipped reclaim policy: the right of `and`/`unless` only filters its GPUs
    reclaim = (
        "max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.20"
        " and on (uuid) gpuops_gpu_allocated == 1"
        " unless on (uuid) gpuops_gpu_shared_jobs > 0"
    )
    assert population(reclaim) == (
        'group by (node, uuid) (nvml_gpu_utilization_ratio{node!="",uuid!=""})'
    )
    # both sides of `or` and of arithmetic give targets; an aggregation that drops a target
    # label gives none (power-down-idle-nodes: the pool comes from `up`)
    assert population("a or b", ("node",)) == 'group by (node) (a{node!=""} or b{node!=""})'
    power_down = (
        "(max by (node) (max_over_time(gpuops_gpu_allocated[10m])) == 0)"
        ' * on (node) group_left (pool) (up{job="gpu-nodes"} == 1)'
        ' and on (node) (up{job="gpu-nodes"} offset 10m)'
    )
    assert population(power_down, ("node", "pool")) == (
        'group by (node, pool) (up{job="gpu-nodes",node!="",pool!=""})'
    )
    assert population("sum by (pool) (rate(x[5m])) > 1", ("pool",)) == (
        'group by (pool) (x{pool!=""})'
    )
    assert population("sum(x) > 1 or y", ("pool",)) == 'group by (pool) (y{pool!=""})'
    # the same selector twice is read once
    assert population("a > 1 or a < 0", ("node",)) == 'group by (node) (a{node!=""})'
    # topk, bottomk, limitk and limit_ratio pick series and keep all their labels, `by` and
    # `without` only group the picking: their results come from their inner expression
    assert population("topk(5, gpu_temp) > 80 or xid_errors > 0") == (
        'group by (node, uuid) (gpu_temp{node!="",uuid!=""} or xid_errors{node!="",uuid!=""})'
    )
    for picked in ("topk by (node) (1, x)", "bottomk without (uuid) (2, x)", "limitk(2, x)"):
        assert population(picked) == 'group by (node, uuid) (x{node!="",uuid!=""})', picked
    assert population("limit_ratio(0.5, x)") == 'group by (node, uuid) (x{node!="",uuid!=""})'


def test_population_falls_back_to_any_series_where_its_sources_cannot_be_told() -> None:
    wide = 'group by (node, uuid) ({node!="", uuid!=""})'  # as before
    assert population('label_replace(x, "uuid", "$1", "gpu", "(.*)")') == wide
    assert population('absent(x{node="a"})') == wide
    assert population('count_values("uuid", x)') == wide
    assert population("x offset 10m > 1") == wide  # reads the past only
    assert population("vector(1)") == wide
    # limits.population overrides it
    from gpuops.model.guardrails import population_expr

    given = replace(POLICY, expr="x", target=("node",), max_fraction=0.1, population="up")
    assert population_expr(given) == "up"


def test_population_escapes_the_policys_label_values() -> None:
    import promql_parser

    value = 'a"b\\c\nd'
    expr = f'x{{pool={json.dumps(value)}, gpu=~{json.dumps("0|1")}, job!~"z.*"}} > 1'
    found = population(expr, ("node",))
    assert found is not None
    selectors: list[promql_parser.VectorSelector] = []
    promql_parser.walk(
        promql_parser.parse(found),
        lambda n: not (isinstance(n, promql_parser.VectorSelector) and selectors.append(n)),
    )
    (selector,) = selectors
    matchers = {(m.name, str(m.op), m.value) for m in selector.matchers.matchers}
    assert ("pool", str(promql_parser.MatchOp.Equal), value) in matchers
    assert ("gpu", str(promql_parser.MatchOp.Re), "0|1") in matchers
    assert ("job", str(promql_parser.MatchOp.NotRe), "z.*") in matchers
    assert ("node", str(promql_parser.MatchOp.NotEqual), "") in matchers
    assert selector.name == "x"


def test_dry_run_is_neither_held_nor_counted_by_the_global_budget() -> None:
    dry = replace(POLICY, name="dry", mode="dry-run", cooldown_s=0)
    state = GuardrailState()
    d, state = judge(fire("a", dry), dry, state, Context(global_max_per_hour=0), 0)
    assert d.verdict == "dry_run"
    assert state.recent == ()  # so an enforcing policy still has the whole budget
    d, _ = judge(fire("b"), replace(POLICY, cooldown_s=0), state, Context(global_max_per_hour=1), 0)
    assert d.verdict == "execute"


def test_targets_held_by_the_global_budget_are_decided_again_only_as_it_frees_up() -> None:
    """Held targets are not all decided again every ``RETRY_S`` (at 50k GPUs, some 80,000
    decisions an evaluation): 400 firing targets, a budget of 10 per hour, 3 hours of
    evaluations 30 s apart: after the first only a few decisions per evaluation, 10 actions per
    hour, and no target starves the queue (the held ones run in order as places free up)."""
    policy = POLICY
    samples = tuple(Sample(freeze({"uuid": f"GPU-{i:03d}"}), 0.1, 0) for i in range(400))
    state, guard = PolicyState(), GuardrailState()
    ctx = Context(global_max_per_hour=10)
    per_round, ran = [], []
    for n in range(360):
        now = 1000.0 + 30 * n
        step = evaluate(policy, QueryResult(samples), state, now)
        judged = judge_step(policy, step.decisions, step.state, guard, ctx, now)
        assert judged.policy_state is not None
        state, guard = judged.policy_state, judged.guardrails
        per_round.append(len(step.decisions))
        ran += [(now, d.target.key) for d in judged.decisions if d.verdict == "execute"]
    assert per_round[0] == 400
    assert max(per_round[1:]) <= 10, per_round  # at most the places that free up at once
    assert sum(per_round[1:]) <= 40, sum(per_round[1:])
    assert len(ran) == 30  # 10 per hour, 3 hours
    hourly = [
        sum(1 for at, _ in ran if 1000 + 3600 * h <= at < 1000 + 3600 * (h + 1)) for h in range(3)
    ]
    assert hourly == [10, 10, 10]
    assert len({key for _, key in ran}) == 30  # each a different target
