"""The demo's summary counts an action that changed nothing apart from those that did, and the
jobs a migrate requeued apart from those it moved."""

from __future__ import annotations

from typing import Any

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
)
from gpuops.sim.demo_report import DemoReport


def migrate(node: str) -> Decision:
    return Decision(
        id=node,
        policy="migrate-off-down-nodes",
        group="g",
        target=Target(f"node={node}", {"node": node}),
        transition=Transition.FIRE,
        action=ActionSpec("migrate", "fleet"),
        evidence=Evidence("up == 0", 0.0, 1.0, 2.0),
        at=2.0,
        episode_start=1.0,
    )


def ran(changed: dict[str, Any]) -> Outcome:
    return Outcome(OutcomeStatus.SUCCESS, attempts=1, changed=changed)


def test_a_migrate_that_moved_no_job_is_not_counted_as_one() -> None:
    report = DemoReport(counters={"migrated": 1, "requeued_by_migrate": 2})
    report.add(migrate("n1"), ran({"node": "n1", "moved": [], "requeued": ["job-1", "job-2"]}))
    report.add(migrate("n2"), ran({"node": "n2", "moved": [{"job": "job-3", "to": "n4"}]}))
    summary = report.summary(60)
    assert (
        "The engine ran 2 actions through the fleet's control API (1 changed nothing):" in summary
    )
    assert "jobs migrated: 1   jobs requeued for want of a node: 2" in summary
