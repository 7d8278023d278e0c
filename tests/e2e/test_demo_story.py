"""`gpuops demo` shows the safety, not only the actions: two nodes failing at
once, one held back by the blast-radius limit with its audit record; a new policy added while it
runs, in dry-run; a summary in sentences. The demo's own timeline, compressed to ~35 s."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from gpuops.audit.spool import read_spool
from gpuops.sim.demo import DEMO_RULES, Demo, DemoSettings
from tests.demo_process import GPUOPS, demo_process
from tests.waiting import wait_for

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
        api_listen="127.0.0.1:0",
    )
    runner = Demo(settings, out=lines.append)
    report = runner.run()
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
    # the failed node's jobs moved, or waited in the queue when no GPU was free: said apart
    off = report.counters["migrated"] + report.counters["requeued_by_migrate"]
    assert off >= 1 and report.outcomes["success"] >= 1

    summary = report.summary(35.0)
    assert f"jobs requeued for want of a node: {report.counters['requeued_by_migrate']}" in summary
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
    # nobody granted the downclock: the summary says it still waits
    told = runner.summary(35.0).split("Approvals asked for: 1 (policies with approval: required)\n")
    assert told[1].startswith("  downclock-underused-gpus: downclock on node=node-3,uuid=GPU-")
    assert "-> pending (nobody granted it during the demo)" in told[1]


def test_gpuops_demo_serves_the_console_asks_for_an_approval_and_ends_by_itself(
    tmp_path: Path,
) -> None:
    """The command as a user runs it: the URL and an admin token printed at start, the
    downclock granted with `gpuops approvals grant ID --reason`, the summary at the end of
    --duration without Ctrl-C."""
    args = ["--duration", "50", "--api-port", "0", "--workdir", str(tmp_path / "work")]
    with demo_process(*args, "--audit-dir", str(tmp_path / "audit")) as (proc, lines):
        asked = wait_for(lambda: _found(lines, GRANT), 60, "the demo to ask for an approval")
        env = dict(os.environ, **_found(lines, ACCESS))  # type: ignore[arg-type]
        granted = subprocess.run(
            [str(GPUOPS), "approvals", "grant", asked["id"], "--reason", "the user agreed"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert granted.returncode == 0, granted.stderr
        assert proc.wait(timeout=90) == 0  # ends by itself
    output = "".join(lines)
    assert lines[0] == (
        "The demo runs 50 s (--duration); Ctrl-C ends it early, with the summary.\n"
    )
    assert re.search(r"console: http://127\.0\.0\.1:\d+/ \(sign in with the admin token\)", output)
    assert "granted and run: downclock on node=node-3,uuid=GPU-" in output
    assert "== gpuops demo summary" in output
    summary = output.split("== gpuops demo summary", 1)[1]
    assert re.search(
        r"^  downclock-underused-gpus: downclock on node=node-3,uuid=GPU-\S+ -> granted by "
        r"demo-admin, then run: done after 1 attempt: .*1100 MHz",
        summary,
        re.M,
    ), summary
    records = [
        d for d in read_spool(tmp_path / "audit") if d["event"]["action"] == "grant_approval"
    ]
    assert [r["user"]["name"] for r in records] == ["demo-admin"]
    assert records[0]["message"].endswith("-> 200 (the user agreed)")


GRANT = re.compile(r"gpuops approvals grant (?P<id>\S+) --reason")
ACCESS = re.compile(r"export GPUOPS_URL=(?P<GPUOPS_URL>\S+) GPUOPS_TOKEN=(?P<GPUOPS_TOKEN>\S+)")


def _found(lines: list[str], pattern: re.Pattern[str]) -> dict[str, str] | None:
    for line in list(lines):
        if m := pattern.search(line):
            return m.groupdict()
    return None
