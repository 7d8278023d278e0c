"""`gpuops demo` shows the safety, not only the actions: two nodes failing at
once, one held back by the blast-radius limit with its audit record; a new policy added while it
runs, in dry-run; a summary in sentences. The demo's own timeline, compressed to ~35 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.sim.demo import DEMO_RULES, Demo, DemoSettings

pytestmark = pytest.mark.e2e


def test_the_demo_tells_what_the_guardrails_held_back_and_what_dry_run_decided(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    settings = DemoSettings(
        duration_s=35.0,
        workdir=tmp_path / "work",
        audit_dir=tmp_path / "audit",
        timeline=((3.0, "burst"), (3.0, "new_policy"), (8.0, "fail_nodes")),
    )
    report = Demo(settings, out=lines.append).run()
    output = "\n".join(lines)

    (held,) = report.held_back
    assert (held.policy, held.action, held.verdict) == (
        "migrate-off-down-nodes",
        "migrate",
        "suppressed:max_fraction",
    ), output
    assert "max_fraction=0.25 allows 1" in held.reason
    assert report.held_back_record is not None
    assert report.held_back_record["gpuops.verdict"] == "suppressed:max_fraction"
    assert report.held_back_record["gpuops.target.key"] == held.target
    assert report.held_back_record["event.outcome"] == "unknown"  # decided, never executed
    assert {(d.policy, d.verdict) for d in report.dry_runs} == {("scale-out-early", "dry_run")}
    assert report.counters["migrated"] >= 1 and report.outcomes["success"] >= 1

    summary = report.summary(35.0)
    assert "The guardrails held back 1 decision (recorded and audited, not executed):" in summary
    assert (
        f"  migrate-off-down-nodes: migrate on {held.target} -> suppressed:max_fraction" in summary
    )
    assert "(blast radius: a policy may act on only this share of its targets" in summary
    record_line = summary.split("the audit record of the first one:\n", 1)[1].splitlines()[0]
    assert json.loads(record_line) == report.held_back_record
    assert "  scale-out-early: would scale_out on pool=default" in summary
    assert "to let scale-out-early act: set mode: enforce in its rule file" in summary
    assert not (DEMO_RULES / "scale-out-early.yaml").exists()  # added to the demo's copy only
    assert (tmp_path / "work" / "rules" / "scale-out-early.yaml").is_file()
