"""Paced repair as pure functions: a width that starts at 1 and grows by one per repair
proven (doubling as the repairs it let run hold), drops to 1 on a failure with a cooldown
from 1 to 10 minutes, jittered and never zero, every deferral naming its domain; a node's
domains by label, and the bound on a domain's nodes out of service (never zero)."""

from __future__ import annotations

from gpuops.model.health.pacing import (
    Domain,
    Outage,
    Pace,
    allowed,
    deferred,
    domains_of,
    failed,
    outages,
    over_bound,
    proved,
)

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


def test_a_node_belongs_to_one_domain_per_label_named_and_default_without_it() -> None:
    labels = {"pool": "a100", "rack": "r12", "policy": "repair"}
    assert domains_of(["pool", "rack"], labels) == ("pool=a100", "rack=r12")
    assert domains_of(["zone", "policy"], labels) == ("zone=default", "policy=repair")
    assert domains_of(["pool"], {"pool": ""}) == ("pool=default",)


def node(name: str, rack: str, pool: str = "a100") -> dict[str, str]:
    return {"node": name, "rack": rack, "pool": pool}


def test_outages_count_each_domain_and_leave_the_node_to_repair_out() -> None:
    nodes = [
        (node("n1", "r1"), True),  # the node to repair: drained by gpuops
        (node("n2", "r1"), True),  # drained by someone else
        (node("n3", "r1"), False),
        (node("n4", "r2"), True),
        ({"node": "n5", "pool": "a100"}, False),  # no rack label
    ]
    found = outages(["pool", "rack"], nodes, "n1")
    assert found == {
        "pool=a100": Outage(5, ("n2", "n4"), down=True),
        "rack=r1": Outage(3, ("n2",), down=True),
        "rack=r2": Outage(1, ("n4",), down=True),
        "rack=default": Outage(1, (), down=True),
    }


def test_the_bound_is_a_fraction_rounded_down_and_never_zero() -> None:
    assert [allowed(n, 0.1) for n in (1, 3, 9, 10, 19, 20, 100)] == [1, 1, 1, 1, 1, 2, 10]
    assert allowed(100, 0.29) == 29  # 100 * 0.29 is 28.999999999999996 in floating point
    assert over_bound("rack=r1", Outage(3, ()), 0.1) is None  # one node of three may be out


def test_a_domain_at_its_bound_holds_the_repair_naming_itself_and_the_nodes_out() -> None:
    assert over_bound("rack=r1", Outage(20, ("n2",)), 0.1) is None  # 2 of 20 out: the bound
    assert over_bound("rack=r1", Outage(20, ("n2", "n3")), 0.1) == (
        "paced repair in rack=r1: 2 other node(s) of 20 out of service (n2, n3), at its bound"
        " of 2 (max_fraction 0.1)"
    )
    many = tuple(f"n{i}" for i in range(10, 17))
    assert over_bound("pool=a", Outage(10, many), 0.5) == (
        "paced repair in pool=a: 7 other node(s) of 10 out of service (n10, n11, n12, n13,"
        " n14, ...), at its bound of 5 (max_fraction 0.5)"
    )


def test_the_nodes_gpuops_quarantined_hold_no_repair_and_a_node_out_adds_nothing() -> None:
    nodes = [(node(f"n{i}", "r1"), i < 4) for i in range(10)]  # n0-n3 out: quarantined
    nodes += [(node("n9x", "r1"), True)]  # out for another reason
    found = outages(["rack"], nodes, "n0", quarantined={"n0", "n1", "n2", "n3"})
    assert found == {"rack=r1": Outage(11, ("n9x",), down=True)}
    assert over_bound("rack=r1", found["rack=r1"], 0.2) is None  # a flood: repaired at its pace
    assert over_bound("rack=r1", Outage(20, ("n2", "n3"), down=True), 0.1) is None
    assert over_bound("rack=r1", Outage(20, ("n2", "n3", "n4"), down=True), 0.1) == (
        "paced repair in rack=r1: 3 other node(s) of 20 out of service (n2, n3, n4), past its"
        " bound of 2 (max_fraction 0.1)"
    )
    latched = outages(["rack"], nodes, "n0")  # counted against each other: none would start
    assert over_bound("rack=r1", latched["rack=r1"], 0.2) is not None
