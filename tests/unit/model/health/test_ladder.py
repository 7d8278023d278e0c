"""The remediation ladder as a pure state machine: the climbs, equivalence (a reboot covers a
reset), needs-human after too many remediations, old faults ignored, an admin's clear."""

from __future__ import annotations

import json

import pytest

from gpuops.model.health.catalogue import Remedy
from gpuops.model.health.ladder import (
    LadderRules,
    Move,
    Quarantine,
    Repair,
    Stage,
    after,
    clear,
    due,
    left,
    quarantined,
    start,
)

DAY = 86400.0
RULES = LadderRules()


def fault(at: float = 100.0, remedy: Remedy = Remedy.RESET_GPU, node: str = "n1") -> Quarantine:
    return Quarantine(
        node=node,
        gpu="GPU-1",
        remedy=remedy,
        reason="XID 79 (fell off the bus) x1",
        policy="quarantine-and-repair-faulty-gpu-node",
        executor="scheduler",
        decision_id="d1",
        episode=at,
        pool="a100",
    )


def climbing(
    at: float = 100.0, remedy: Remedy = Remedy.RESET_GPU, before: Repair | None = None
) -> Repair:
    repair, note = quarantined(before, fault(at, remedy), at + 1)
    assert note == ""
    assert repair.stage is Stage.QUARANTINED
    return start(repair, RULES, at + 2)


def run(repair: Repair, *results: bool, now: float = 200.0) -> tuple[Repair, list[str]]:
    """Feed ``results`` to the moves that come due, in order; the moves that ran."""
    ran = []
    for ok in results:
        move = due(repair)
        assert move is not None, f"nothing due in {repair.stage}"
        ran.append(move.value)
        repair = after(repair, move, ok, "" if ok else "exit 1", RULES, now)
    return repair, ran


def test_a_fault_a_reset_fixes_is_reset_checked_and_returned() -> None:
    repair = climbing()
    assert repair.stage is Stage.REMEDIATING
    repair, ran = run(repair, True, True, True)
    assert ran == ["reset_gpu", "validate", "return"]
    assert repair.stage is Stage.RETURNED
    assert repair.returned_at == 200.0
    assert due(repair) is None


def test_a_fault_a_reset_does_not_fix_is_rebooted_then_returned() -> None:
    repair, ran = run(climbing(), True, False, True, True, True)
    assert ran == ["reset_gpu", "validate", "reboot", "validate", "return"]
    assert repair.stage is Stage.RETURNED
    assert repair.done == ("reset_gpu", "reboot")


def test_a_failed_reset_goes_on_to_the_reboot() -> None:
    repair, ran = run(climbing(), False)
    assert (repair.stage, repair.step) == (Stage.REMEDIATING, "reboot")
    assert repair.why == "reset_gpu failed: exit 1"


def test_a_fault_that_calls_for_a_reboot_is_never_reset() -> None:
    repair, ran = run(climbing(remedy=Remedy.REBOOT_NODE), True, False)
    assert ran == ["reboot", "validate"]
    assert repair.stage is Stage.NEEDS_HUMAN  # a reboot covers a reset: nothing left
    assert repair.why == "the health check failed after reboot: exit 1; no step left"


def test_after_a_reboot_no_reset_is_due_whatever_the_order() -> None:
    rules = LadderRules(steps=(Move.REBOOT, Move.RESET_GPU))
    repair, _ = quarantined(None, fault(), 101.0)
    repair = start(repair, rules, 102.0)
    repair = after(repair, Move.REBOOT, True, "", rules, 110.0)
    repair = after(repair, Move.VALIDATE, False, "exit 1", rules, 120.0)
    assert repair.stage is Stage.NEEDS_HUMAN


def test_a_fault_nothing_fixes_needs_a_human_who_is_told_once() -> None:
    repair, ran = run(climbing(), True, False, True, False)
    assert ran == ["reset_gpu", "validate", "reboot", "validate"]
    assert repair.stage is Stage.NEEDS_HUMAN
    assert due(repair) is Move.HAND_OVER
    repair = after(repair, Move.HAND_OVER, True, "", RULES, 300.0)
    assert due(repair) is None


def test_a_node_that_needs_a_human_is_never_remediated_again_by_itself() -> None:
    repair, _ = run(climbing(), True, False, True, False, True)
    again, note = quarantined(repair, fault(at=5000.0), 5001.0)
    assert again == repair
    assert note == "the node needs a human: not remediated until an admin clears it"


def test_a_second_remediation_within_seven_days_is_a_humans() -> None:
    returned, _ = run(climbing(at=100.0), True, True, True)
    repair, note = quarantined(returned, fault(at=3 * DAY), 3 * DAY + 1)
    assert (repair.stage, note) == (Stage.QUARANTINED, "")
    repair = start(repair, RULES, 3 * DAY + 2)
    assert repair.stage is Stage.NEEDS_HUMAN
    assert repair.why.startswith("1 remediation(s) of n1 within 7 days already")


def test_a_remediation_older_than_the_window_does_not_count() -> None:
    returned, _ = run(climbing(at=100.0), True, True, True)
    repair, _ = quarantined(returned, fault(at=8 * DAY), 8 * DAY + 1)
    repair = start(repair, RULES, 8 * DAY + 2)
    assert (repair.stage, repair.step) == (Stage.REMEDIATING, "reset_gpu")
    assert repair.remediated == (8 * DAY + 2,)


def test_a_fault_older_than_the_nodes_return_does_nothing() -> None:
    returned, _ = run(climbing(at=100.0), True, True, True, now=200.0)
    same, note = quarantined(returned, fault(at=150.0), 10 * DAY)
    assert same == returned
    assert note == "the fault began before the node's last return to service: ignored"


def test_a_second_quarantine_while_climbing_changes_nothing() -> None:
    repair = climbing()
    same, note = quarantined(repair, fault(at=150.0), 151.0)
    assert same == repair
    assert note.startswith("already on the ladder (remediating")


def test_a_part_to_replace_goes_to_a_human_at_once() -> None:
    repair = climbing(remedy=Remedy.REPLACE)
    assert repair.stage is Stage.NEEDS_HUMAN
    assert repair.why.endswith("calls for replace: no remediation step heals it")


def test_a_failed_return_needs_a_human() -> None:
    repair, _ = run(climbing(), True, True, False)
    assert repair.stage is Stage.NEEDS_HUMAN
    assert repair.why == "the return to service failed: exit 1"


def test_clear_lets_a_node_climb_again_and_refuses_one_that_needs_no_human() -> None:
    repair, _ = run(climbing(), True, False, True, False)
    cleared = clear(repair, "alice", 400.0)
    assert (cleared.stage, cleared.remediated, cleared.why) == (
        Stage.HEALTHY,
        (),
        "cleared by alice",
    )
    again = start(quarantined(cleared, fault(at=500.0), 501.0)[0], RULES, 502.0)
    assert again.stage is Stage.REMEDIATING
    with pytest.raises(ValueError, match="node n1 is remediating: only a node that needs a human"):
        clear(again, "alice", 600.0)


def test_a_node_someone_took_back_leaves_the_ladder_and_old_faults_never_act() -> None:
    repair, _ = run(climbing(), False)  # the reset failed: the reboot is due
    gone = left(repair, "someone else uncordoned it", 300.0)
    assert (gone.stage, gone.why) == (
        Stage.HEALTHY,
        "left the remediation ladder: someone else uncordoned it",
    )
    assert due(gone) is None and gone.remediated == repair.remediated
    assert quarantined(gone, fault(at=250.0), 400.0)[1].startswith("the fault began before")
    again, note = quarantined(gone, fault(at=350.0), 400.0)
    assert note == "" and again.stage is Stage.QUARANTINED


def test_a_record_survives_json() -> None:
    repair, _ = run(climbing(), True, False)
    assert Repair.from_dict(json.loads(json.dumps(repair.as_dict()))) == repair
