"""Table-driven tests of the pure evaluation state machine, with an injected clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Sample,
    Target,
    Transition,
    decision_id,
    freeze,
)
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.settling import failed, settle
from gpuops.model.evaluation.state import PolicyState, Status
from gpuops.model.evaluation.step import QueryResult
from gpuops.model.rules.model import Policy

POLICY = Policy(
    name="reclaim",
    group="g",
    expr="util < 0.2",
    action=ActionSpec("reclaim", "fleet"),
    on_clear=ActionSpec("restore_clocks", "fleet"),
    for_s=60,
    target=("uuid",),
    mode="enforce",
    annotations=freeze({"summary": "GPU {{ $labels.uuid }} at {{ $value }}"}),
)


def s(uuid: str, value: float = 0.1, **extra: str) -> Sample:
    return Sample(freeze({"uuid": uuid, **extra}), value, 0.0)


def run(policy: Policy, steps: list[tuple[float, QueryResult]]) -> list[tuple[float, str, str]]:
    """Evaluate each (now, result) in turn; return (now, transition, target key) per decision."""
    state = PolicyState()
    out = []
    for now, result in steps:
        step = evaluate(policy, result, state, now)
        state = step.state
        out += [(now, d.transition.value, d.target.key) for d in step.decisions]
    return out


A = QueryResult((s("a"),))
NONE = QueryResult(())
DOWN = QueryResult(error="Prometheus unreachable")


@pytest.mark.parametrize(
    ("name", "policy", "steps", "expected"),
    [
        ("fires after for", POLICY, [(0, A), (30, A), (60, A), (90, A)], [(60, "fire", "uuid=a")]),
        (
            "vanishing while pending resets",
            POLICY,
            [(0, A), (30, NONE), (60, A), (90, A), (120, A)],
            [(120, "fire", "uuid=a")],
        ),
        (
            "flapping input never fires",
            POLICY,
            [(t, A if i % 2 == 0 else NONE) for i, t in enumerate(range(0, 600, 30))],
            [],
        ),
        (
            "clears when it leaves the result",
            POLICY,
            [(0, A), (60, A), (90, NONE)],
            [(60, "fire", "uuid=a"), (90, "clear", "uuid=a")],
        ),
        ("for 0 fires at once", replace(POLICY, for_s=0), [(0, A)], [(0, "fire", "uuid=a")]),
        (
            "outage mid-pending holds the timer",
            POLICY,
            [(0, A), (30, DOWN), (60, A)],
            [(60, "fire", "uuid=a")],
        ),
        (
            "outage with on_no_data skip restarts the timer",
            replace(POLICY, on_no_data="skip"),
            [(0, A), (30, DOWN), (60, A), (90, A), (120, A)],
            [(120, "fire", "uuid=a")],
        ),
        (
            "outage while firing neither clears nor fires",
            POLICY,
            [(0, A), (60, A), (90, DOWN), (120, DOWN), (150, A)],
            [(60, "fire", "uuid=a")],
        ),
        (
            "keep_firing_for delays the clear",
            replace(POLICY, keep_firing_for_s=60),
            [(0, A), (60, A), (90, NONE), (120, NONE), (150, NONE)],
            [(60, "fire", "uuid=a"), (150, "clear", "uuid=a")],
        ),
        (
            "repeat_interval fires again",
            replace(POLICY, repeat_interval_s=100),
            [(0, A), (60, A), (120, A), (160, A), (200, A), (260, A)],
            [(60, "fire", "uuid=a"), (160, "fire", "uuid=a"), (260, "fire", "uuid=a")],
        ),
        (
            "two targets are independent",
            POLICY,
            [
                (0, QueryResult((s("a"),))),
                (30, QueryResult((s("a"), s("b")))),
                (60, QueryResult((s("a"), s("b")))),
                (90, QueryResult((s("b"),))),
            ],
            [(60, "fire", "uuid=a"), (90, "fire", "uuid=b"), (90, "clear", "uuid=a")],
        ),
        (
            "series of one target collapse",
            POLICY,
            [(0, QueryResult((s("a", node="n1"), s("a", node="n2")))), (60, A)],
            [(60, "fire", "uuid=a")],
        ),
    ],
)
def test_state_machine(name: str, policy: Policy, steps, expected) -> None:
    assert sorted(run(policy, steps)) == sorted(expected), name


def test_clear_expr_hysteresis_keeps_firing_until_clear_matches() -> None:
    policy = replace(POLICY, clear_expr="util > 0.5")
    state = PolicyState()
    seen = []
    for now, result in [
        (0, A),
        (60, A),
        (90, QueryResult((), clear_samples=())),  # left expr, but clear_expr not matched
        (120, QueryResult((), clear_samples=())),
        (150, QueryResult((), clear_samples=(s("a", 0.7),))),
    ]:
        step = evaluate(policy, result, state, now)
        state = step.state
        seen += [(now, d.transition.value) for d in step.decisions]
    assert seen == [(60, "fire"), (150, "clear")]
    assert state.targets == {}


def test_clear_expr_wins_over_expr_when_both_match() -> None:
    policy = replace(POLICY, clear_expr="util > 0.5", for_s=0)
    step = evaluate(policy, A, PolicyState(), 0)
    step = evaluate(policy, QueryResult((s("a"),), clear_samples=(s("a"),)), step.state, 10)
    assert [d.transition for d in step.decisions] == [Transition.CLEAR]


def test_failed_query_changes_no_state_and_is_reported() -> None:
    step = evaluate(POLICY, A, PolicyState(), 0)
    after = evaluate(POLICY, DOWN, step.state, 30)
    # the timer is kept; only where the stretch without fresh data began is noted
    (pending,) = step.state.targets.values()
    assert after.state.targets == {"uuid=a": replace(pending, absent_since=30)}
    assert after.decisions == ()
    assert after.skipped is not None and after.skipped.error == "Prometheus unreachable"


def test_decision_ids_are_stable_per_episode() -> None:
    first = run_decisions(POLICY, [(0, A), (60, A)])
    again = run_decisions(POLICY, [(0, A), (60, A)])
    later = run_decisions(POLICY, [(100, A), (160, A)])
    assert first[0].id == again[0].id == decision_id("reclaim", "uuid=a", 0.0, "fire")
    assert first[0].id != later[0].id


def test_decisions_carry_action_evidence_and_rendered_annotations() -> None:
    fire, clear = run_decisions(
        POLICY, [(0, QueryResult((s("a", 0.05),))), (60, A), (70, NONE)], executed=True
    )
    assert fire.action == POLICY.action and clear.action == POLICY.on_clear
    assert fire.evidence.pending_since == 0 and fire.evidence.value == 0.1
    assert fire.annotations["summary"] == "GPU a at 0.1"
    assert fire.target.labels == {"uuid": "a"}
    assert "held for 60s" in fire.reason


def test_a_summary_tells_its_value_as_what_it_is() -> None:
    """``{{ $value }}`` in a summary reads as a person would say it: a utilization as a
    percentage, a target that is down as ``down``, a count whole; never ``0.249809``."""
    told = {
        "avg_over_time(gpu_utilization_ratio[30m]) < 0.3": (0.24980943717528903, "at 25%"),
        'up{job="gpu-nodes"} == 0': (0.0, "at down"),
        "sum by (pool) (gpuops_queue_pending_jobs) > 10": (36.0, "at 36"),
        "some_metric > 1": (1.23456789, "at 1.235"),
    }
    for expr, (value, words) in told.items():
        policy = replace(POLICY, expr=expr, for_s=0)
        [fire] = run_decisions(policy, [(0, QueryResult((s("a", value),)))])
        assert fire.annotations["summary"] == f"GPU a {words}", expr
        assert fire.evidence.value == value  # the number itself stays in the evidence


def test_pending_and_firing_states_are_visible() -> None:
    step = evaluate(POLICY, A, PolicyState(), 0)
    assert step.state.targets["uuid=a"].status is Status.PENDING
    step = evaluate(POLICY, A, step.state, 60)
    assert step.state.firing() == ["uuid=a"]


def run_decisions(
    policy: Policy,
    steps: list[tuple[float, QueryResult]],
    executed: bool = False,
    verdict: Callable[[Decision], str] | None = None,
):
    """Evaluate each step; with ``executed`` (or a ``verdict`` function) feed verdicts back
    through ``settle`` as the runtime does (retries 100 s after a suppression)."""
    state = PolicyState()
    out = []
    for now, result in steps:
        step = evaluate(policy, result, state, now)
        state = step.state
        judged = list(step.decisions)
        if verdict is not None or executed:
            judged = [
                d.with_verdict(verdict(d) if verdict else "execute", d.reason) for d in judged
            ]
            state = settle(state, judged, lambda d, now=now: now + 100)
        out += judged
    return out


def test_a_clear_undoes_only_what_ran() -> None:
    steps = [(0, A), (60, A), (70, NONE)]
    fire, clear = run_decisions(POLICY, steps, verdict=lambda d: "awaiting_approval")
    assert clear.action is None and "nothing to undo" in clear.reason
    fire, clear = run_decisions(POLICY, steps, executed=True)
    assert clear.action == POLICY.on_clear


def test_a_suppressed_fire_is_decided_again_at_its_retry_time() -> None:
    first = {"done": False}

    def cooldown_once(d: Decision) -> str:
        if d.transition is Transition.FIRE and not first["done"]:
            first["done"] = True
            return "suppressed:cooldown"
        return "execute"

    steps = [(t, A) for t in range(0, 300, 30)]
    decisions = run_decisions(POLICY, steps, verdict=cooldown_once)
    assert [(d.at, d.verdict) for d in decisions] == [(60, "suppressed:cooldown"), (180, "execute")]
    assert decisions[0].id != decisions[1].id and decisions[1].repeat == 1


def test_an_undo_held_back_is_tried_again_and_a_returning_condition_cancels_it() -> None:
    held = {"n": 0}

    def kill_first_clear(d: Decision) -> str:
        if d.transition is Transition.CLEAR and held["n"] == 0:
            held["n"] += 1
            return "suppressed:kill_switch"
        return "execute"

    steps = [(0, A), (60, A), (90, NONE), (150, NONE), (200, NONE)]
    got = [
        (d.at, d.transition.value, d.verdict)
        for d in run_decisions(POLICY, steps, verdict=kill_first_clear)
    ]
    assert got == [
        (60, "fire", "execute"),
        (90, "clear", "suppressed:kill_switch"),
        (200, "clear", "execute"),
    ]
    # the condition returns while the undo waits: firing again, no second action
    steps = [(0, A), (60, A), (90, NONE), (120, A), (300, A)]
    held["n"] = 0
    got = [
        (d.at, d.transition.value) for d in run_decisions(POLICY, steps, verdict=kill_first_clear)
    ]
    assert got == [(60, "fire"), (90, "clear")]


def test_on_no_data_skip_keeps_an_undo_that_waits() -> None:
    policy = replace(POLICY, on_no_data="skip")
    step = evaluate(policy, A, PolicyState(), 0)
    step = evaluate(policy, A, step.state, 60)
    state = settle(step.state, [d.with_verdict("execute", "") for d in step.decisions], lambda d: 0)
    step = evaluate(policy, NONE, state, 90)
    (clear,) = step.decisions
    held = settle(step.state, [clear.with_verdict("suppressed:paused", "")], lambda d: 200)
    after = evaluate(policy, DOWN, held, 120)
    assert after.state == held  # the clearing target survives the outage
    (retried,) = evaluate(policy, NONE, after.state, 200).decisions
    assert retried.transition is Transition.CLEAR and retried.action == POLICY.on_clear


def test_a_condition_returning_while_the_undo_waits_gets_new_ids_and_repeats_go_on() -> None:
    policy = replace(POLICY, repeat_interval_s=100)
    step = evaluate(policy, A, PolicyState(), 0)
    step = evaluate(policy, A, step.state, 60)
    state = settle(step.state, [d.with_verdict("execute", "") for d in step.decisions], lambda d: 0)
    step = evaluate(policy, NONE, state, 70)
    (held,) = step.decisions
    state = settle(step.state, [held.with_verdict("suppressed:kill_switch", "")], lambda d: 130)
    step = evaluate(policy, A, state, 80)  # back before the undo could run
    assert step.decisions == () and step.state.targets["uuid=a"].status is Status.FIRING
    repeat = evaluate(policy, A, step.state, 180)  # repeat_interval goes on
    assert [d.transition for d in repeat.decisions] == [Transition.FIRE]
    state = settle(
        repeat.state, [d.with_verdict("execute", "") for d in repeat.decisions], lambda d: 0
    )
    (clear,) = evaluate(policy, NONE, state, 190).decisions
    assert clear.id != held.id and clear.action == POLICY.on_clear


def test_a_failed_repeat_keeps_the_undo_of_the_action_that_ran() -> None:
    policy = replace(POLICY, repeat_interval_s=100)
    step = evaluate(policy, A, PolicyState(), 0)
    step = evaluate(policy, A, step.state, 60)
    state = settle(step.state, [d.with_verdict("execute", "") for d in step.decisions], lambda d: 0)
    step = evaluate(policy, A, state, 160)
    (repeat,) = step.decisions
    state = settle(step.state, [repeat.with_verdict("execute", "")], lambda d: 0)
    state = failed(state, repeat, retry_at=220)
    (clear,) = evaluate(policy, NONE, state, 170).decisions
    assert clear.action == POLICY.on_clear  # the first action did run


def test_label_values_never_make_two_series_one_target() -> None:
    """Labels are data: commas and backslashes in values are escaped in the key, so a series
    crafted to spell another target's key is a target of its own and acts on its own labels."""
    policy = replace(POLICY, target=("a", "b"), for_s=0)
    first = Sample(freeze({"a": "1,b=2", "b": "3"}), 0.1, 0.0)
    crafted = Sample(freeze({"a": "1", "b": "2,b=3"}), 0.1, 0.0)
    step = evaluate(policy, QueryResult((first, crafted)), PolicyState(), 0)
    assert sorted(d.target.key for d in step.decisions) == ["a=1,b=2\\,b=3", "a=1\\,b=2,b=3"]
    # the first seen before, then only the crafted one: a target of its own, its own labels
    again = evaluate(policy, QueryResult((crafted,)), step.state, 30)
    fired = {d.target.key: d.target.labels for d in again.decisions if d.transition.value == "fire"}
    assert fired == {}, "the crafted series was firing already under its own key"
    [cleared] = [d for d in again.decisions if d.transition.value == "clear"]
    assert dict(cleared.target.labels) == {"a": "1,b=2", "b": "3"}
    assert Target.from_labels(crafted.labels, ("a", "b")).key == "a=1,b=2\\,b=3"
    assert Target.from_labels(freeze({"uuid": "GPU-1"}), ("uuid",)).key == "uuid=GPU-1"
