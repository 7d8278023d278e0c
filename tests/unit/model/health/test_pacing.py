"""Paced repair as pure functions: a width that starts at 1 and grows by one per repair
proven (doubling as the repairs it let run hold), drops to 1 on a failure with a cooldown
from 1 to 10 minutes, jittered and never zero, every deferral naming its domain."""

from __future__ import annotations

from gpuops.model.health.pacing import Domain, Pace, deferred, failed, proved

PACE = Pace()


def test_the_width_starts_at_one_and_doubles_per_round_of_repairs_that_hold() -> None:
    domain, widths = Domain("a100"), []
    for _ in range(4):
        widths.append(domain.width)
        for _ in range(domain.width):  # every repair let run holds
            domain = proved(domain)
    assert widths == [1, 2, 4, 8]
    assert domain.proven == 15


def test_a_domain_defers_past_its_width_naming_itself() -> None:
    domain = Domain("a100", width=2)
    assert deferred(domain, 1, PACE, 0.0) is None
    assert deferred(domain, 2, PACE, 0.0) == (
        "paced repair in a100: 2 unproven repair(s) at width 2 (it grows as repairs stay"
        " healthy 5m)"
    )


def test_a_failure_drops_the_width_to_one_and_cools_down_from_one_to_ten_minutes() -> None:
    domain = Domain("a100", width=8)
    cooldowns = []
    for _ in range(6):
        domain = failed(domain, PACE, 1000.0, draw=0.5)  # no jitter
        cooldowns.append(domain.cooldown_until - 1000.0)
        assert domain.width == 1
    assert cooldowns == [60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    assert deferred(domain, 0, PACE, 1599.0) == (
        "paced repair in a100: cooling down 1s after a failed repair"
    )
    assert deferred(domain, 0, PACE, 1600.0) is None
    assert proved(domain).failures == 0  # a repair that holds starts the cooldowns over


def test_the_cooldown_is_jittered_and_never_zero() -> None:
    low = failed(Domain("a"), PACE, 0.0, draw=0.0).cooldown_until
    high = failed(Domain("a"), PACE, 0.0, draw=0.999).cooldown_until
    assert (low, round(high, 1)) == (48.0, 72.0)
    tiny = Pace(cooldown_s=0.5, jitter=0.9)
    assert failed(Domain("a"), tiny, 0.0, draw=0.0).cooldown_until == 1.0


def test_domains_are_independent() -> None:
    flooded = Domain("a100", width=1)
    assert deferred(flooded, 49, PACE, 0.0) is not None
    assert deferred(Domain("h100"), 0, PACE, 0.0) is None
