"""The plan of a batch operation: targets, skips, waves under max_unavailable, refusals."""

from __future__ import annotations

import pytest

from gpuops.model.batch.operation import (
    Availability,
    Budget,
    FleetNode,
    Operation,
    Step,
    StepKind,
    Targets,
    Timing,
)
from gpuops.model.batch.plan import PlanError, plan, remaining

STEP = Step(StepKind.COMMAND, command=("true",))


def fleet(count: int, **states: Availability) -> list[FleetNode]:
    return [
        FleetNode(
            name=f"n{i:02d}",
            pool="a100",
            gpus=8,
            features=frozenset({"a100"}),
            availability=states.get(f"n{i:02d}", Availability.UP),
        )
        for i in range(1, count + 1)
    ]


def op(**changes: object) -> Operation:
    base: dict[str, object] = {
        "name": "up",
        "targets": Targets(pool="a100", everything=True),
        "step": STEP,
        "max_unavailable": Budget(count=1),
        "timing": Timing(quarantine_s=1, step_s=2, reboot_s=3, validate_s=4, return_s=5),
    }
    base.update(changes)
    return Operation(**base)  # type: ignore[arg-type]


def test_fifty_nodes_canary_two_ten_percent_never_more_than_five_out() -> None:
    nodes = fleet(50)
    made = plan(op(canary=2, max_parallel=5, max_unavailable=Budget(percent=10)), nodes)
    assert made.budget == 5
    assert made.waves[0].canary and made.waves[0].nodes == ("n01", "n02")
    assert [len(w.nodes) for w in made.waves] == [2] + [5] * 9 + [3]
    assert all(w.unavailable <= 5 for w in made.waves)
    assert made.waves[1].gpus_available == 400 - 5 * 8
    done = [n for w in made.waves for n in w.nodes]
    assert sorted(done) == [n.name for n in nodes]  # each node once
    assert made.duration_s == len(made.waves) * (1 + 2 + 5)


def test_every_node_already_out_counts_against_the_budget() -> None:
    nodes = fleet(20, n05=Availability.DRAINED, n06=Availability.DOWN)
    made = plan(op(max_parallel=4, max_unavailable=Budget(count=3), canary=0), nodes)
    assert made.already_unavailable == ("n05", "n06")
    assert made.skipped[0].node == "n06" and made.skipped[0].why == "down"
    assert made.kept_drained == ("n05",)
    # one up node at a time (3 - 2 out); the drained n05 costs nothing more
    for wave in made.waves:
        up = [n for n in wave.nodes if n != "n05"]
        assert len(up) == 1
        assert wave.unavailable == 3


def test_skip_label_skips_and_reports() -> None:
    nodes = fleet(4)
    nodes[1] = FleetNode("n02", pool="a100", gpus=8, labels={"gpuops.io/batch-skip": "yes"})
    made = plan(op(max_unavailable=Budget(count=1)), nodes)
    assert [(s.node, s.why) for s in made.skipped] == [("n02", "skip label gpuops.io/batch-skip")]
    assert "n02" not in made.targets


def test_reboot_and_validation_add_to_each_wave() -> None:
    from gpuops.model.batch.operation import Validation

    made = plan(
        op(reboot=STEP, validate=Validation(("true",)), max_unavailable=Budget(count=1)), fleet(2)
    )
    assert made.waves[0].duration_s == 1 + 2 + 3 + 4 + 5


@pytest.mark.parametrize(
    ("changes", "nodes", "problem"),
    [
        (
            {"targets": Targets(pool="h100")},
            fleet(3),
            "targets: pool h100 matches no node of the fleet (3 nodes)",
        ),
        (
            {"targets": Targets(pool="a100")},
            fleet(3),
            "targets: pool a100 matches every node of the fleet (3); say `all: true` under"
            " targets to mean it",
        ),
        (
            {"targets": Targets(nodes=("n01", "n09"))},
            fleet(3),
            "targets.nodes: n09 is no node of the fleet (3 nodes)",
        ),
        (
            {"max_unavailable": Budget(percent=10)},
            fleet(5),
            "max_unavailable: 10% of 5 nodes leaves no room for one node",
        ),
    ],
)
def test_refused_naming_the_field(
    changes: dict[str, object], nodes: list[FleetNode], problem: str
) -> None:
    with pytest.raises(PlanError) as caught:
        plan(op(**changes), nodes)
    assert caught.value.problems == [problem]


def test_no_room_left_by_nodes_already_out() -> None:
    nodes = fleet(10, n01=Availability.DOWN, n02=Availability.DRAINED)
    with pytest.raises(PlanError) as caught:
        plan(op(max_unavailable=Budget(count=2)), nodes)
    assert caught.value.problems == [
        "max_unavailable: 2 of 10 nodes is 2, and 2 are unavailable already (n01, n02): no"
        " room for one node"
    ]


def test_inventory_must_hold_every_target() -> None:
    operation = op(
        step=Step(StepKind.ANSIBLE, playbook="p.yml", inventory="inv.yaml"),
        max_unavailable=Budget(count=1),
    )
    with pytest.raises(PlanError) as caught:
        plan(operation, fleet(3), inventory={"n01"})
    assert caught.value.problems == [
        "step.inventory: inv.yaml does not match the targets: it lacks n02, n03 (2 of 3)"
    ]


def test_a_node_in_another_operation_is_refused() -> None:
    nodes = fleet(3)
    nodes[2] = FleetNode("n03", pool="a100", gpus=8, busy="firmware-7")
    with pytest.raises(PlanError) as caught:
        plan(op(max_unavailable=Budget(count=1)), nodes)
    assert caught.value.problems == [
        "targets: n03 (in firmware-7): a node is in one operation at a time; wait for it to"
        " finish or leave the node out"
    ]


def test_remaining_counts_the_operations_own_held_nodes() -> None:
    nodes = fleet(10)
    operation = op(max_parallel=5, max_unavailable=Budget(count=3))
    made = remaining(operation, nodes, nodes[2:], nodes, 3, canary=False, extra_unavailable={"n01"})
    assert made.waves[0].nodes == ("n03", "n04")
    assert made.waves[0].unavailable == 3
