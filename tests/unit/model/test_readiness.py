"""Why a policy has not acted: each pending or firing target, when it may act next and what it
waits for (its ``for``, cooldown, ``max_per_hour``, ``repeat_interval``, a hold)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuops.model.decisions import ActionSpec, freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.guardrails import Execution, GuardrailState, cooldown_key
from gpuops.model.readiness import duration, readiness
from gpuops.model.rules.model import Policy

NOW = 100_000.0
POLICY = Policy(
    name="reclaim-idle",
    group="g",
    expr="gpu_util < 5",
    action=ActionSpec("reclaim", "fleet"),
    target=("uuid",),
    for_s=600,
    cooldown_s=3600,
)


def target(status: Status, since: float, **kw: Any) -> TargetState:
    return TargetState(status, since, NOW, 0.5, freeze({"uuid": "GPU-1"}), **kw)


def one(
    policy: Policy, state: TargetState, guardrails: GuardrailState | None = None
) -> tuple[str, float | None, str]:
    [found], total = readiness(
        policy, PolicyState(freeze({"uuid=GPU-1": state})), guardrails or GuardrailState(), NOW, 10
    )
    assert total == 1
    return found.status, found.next_at, found.waits_for


def test_a_pending_target_waits_for_its_for() -> None:
    assert one(POLICY, target(Status.PENDING, NOW - 100)) == ("pending", NOW + 500, "for 10m")


def test_a_pending_target_acted_on_recently_waits_for_the_cooldown_when_it_ends_later() -> None:
    acted = GuardrailState(freeze({cooldown_key(POLICY.name, "uuid=GPU-1"): NOW - 1200}))
    assert one(POLICY, target(Status.PENDING, NOW - 100), acted) == (
        "pending",
        NOW + 2400,
        "cooldown 1h",
    )


def test_max_per_hour_spent_holds_a_target_until_the_oldest_action_leaves_the_hour() -> None:
    limited = replace(POLICY, max_per_hour=2, cooldown_s=0)
    spent = GuardrailState(
        recent=(
            Execution(NOW - 3000, POLICY.name, "uuid=GPU-8"),
            Execution(NOW - 1000, POLICY.name, "uuid=GPU-9"),
            Execution(NOW - 10, "another-policy", "uuid=GPU-7"),
        )
    )
    assert one(limited, target(Status.PENDING, NOW - 900), spent) == (
        "pending",
        NOW + 600,
        "max_per_hour 2",
    )


def test_a_firing_target_without_repeat_interval_does_not_act_again_in_its_episode() -> None:
    status, at, why = one(POLICY, target(Status.FIRING, NOW - 900, last_fire_at=NOW - 300))
    assert (status, at) == ("firing", None)
    assert "clears and fires anew" in why


def test_a_held_firing_target_is_decided_again_at_its_retry_time() -> None:
    held = target(Status.FIRING, NOW - 900, retry_at=NOW + 60, held="suppressed:max_fraction")
    assert one(POLICY, held) == ("firing", NOW + 60, "held back (suppressed:max_fraction)")


def test_pending_targets_come_first_and_the_total_counts_them_all() -> None:
    states = {
        f"uuid=GPU-{n}": target(Status.FIRING if n % 2 else Status.PENDING, NOW - n)
        for n in range(5)
    }
    shown, total = readiness(POLICY, PolicyState(freeze(states)), GuardrailState(), NOW, 2)
    assert total == 5
    assert [r.key for r in shown] == ["uuid=GPU-0", "uuid=GPU-2"]


def test_durations_read_as_a_user_writes_them() -> None:
    assert [duration(s) for s in (0, 45, 600, 5400, 90000)] == ["0s", "45s", "10m", "1h30m", "1d1h"]
