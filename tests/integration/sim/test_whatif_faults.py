"""`gpuops whatif --faults` end to end: GPU faults and application XID floods injected into
both runs of the 128-GPU training fleet; in the policies-on run the real engine gets each
fault as the node agent pushes it, quarantines the node through the fleet, and the
remediation ladder resets, reboots, checks and returns it or hands it to a person."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.audit.spool import read_spool
from gpuops.cli import cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
ARGS = [
    "--log-level=warning",
    "whatif",
    "--fleet",
    str(REPO / "examples/fleets/training.yaml"),
    "--rules",
    str(REPO / "rules/fleet/health.yaml"),
    "--hours=4",
]


def test_faults_are_quarantined_and_repaired_on_and_left_to_a_person_off(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [*ARGS, "--faults=3000", "--floods=24", "--human-response=2h", "--json"]
        + [f"--workdir={tmp_path}"],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["faults"]["scale"] == 3000 and doc["faults"]["response_s"] == 7200
    off, on = doc["off"]["reliability"], doc["on"]["reliability"]
    assert off["faults"] == on["faults"] >= 5  # the same faults in both runs
    assert off["flood_events"] > 0 and on["flood_events"] > 0
    # the engine quarantined faulty nodes only: no flood of XID 45 took a healthy node out
    assert on["quarantines_true"] >= 1 and on["quarantines_false"] == 0
    assert on["resets"] + on["reboots"] >= 1
    assert off["quarantines_true"] == off["resets"] == off["reboots"] == 0
    # pushed at the end of the cluster step (15 s) rather than noticed by a person (2 h)
    assert on["to_quarantine_p95_s"] <= 15
    assert off["to_quarantine_median_s"] >= 7200
    # a faulty GPU left in service crashes the jobs placed on it; one quarantined at the end
    # of its cluster step is not left in service
    assert off["faulty_gpu_hours"] > 0
    assert on["faulty_gpu_hours"] <= on["faults"] * 15 / 3600
    assert on["job_crashes"] < off["job_crashes"]
    # without gpuops a person repairs every fault noticed; with it the ladder hands some over
    assert off["hand_overs"] == 0 and off["person_repairs"] >= 1
    assert on["hand_overs"] >= 1
    for run in (off, on):  # each GPU-hour lost counted once: never more than the fleet had
        assert run["lost_gpu_hours"] <= run["capacity_gpu_hours"]
    assert on["crash_gpu_hours"] < off["crash_gpu_hours"]
    # every ladder move was audited, its intent before its result
    moves = [
        d
        for d in read_spool(tmp_path / "engine" / "audit")
        if d.get("rule", {}).get("ruleset") == "health-ladder"
    ]
    verbs = {d["event"].get("action") for d in moves}
    assert {"reset_gpu", "reboot"} & verbs and "validate" in verbs
    for decision in {d["gpuops"]["decision"]["id"] for d in moves if d["event"].get("action")}:
        told = [d for d in moves if d["gpuops"]["decision"]["id"] == decision]
        assert told[0]["event"].get("outcome") in (None, "unknown")  # the intent came first


def test_a_bad_fault_option_is_refused_naming_it() -> None:
    runner = CliRunner()
    zero = runner.invoke(cli, [*ARGS, "--faults=0"])
    assert zero.exit_code == 2 and "--faults" in zero.output
    late = runner.invoke(cli, [*ARGS, "--faults=10", "--human-response=4x"])
    assert late.exit_code == 2 and "--human-response" in late.output
    assert "invalid duration '4x'" in late.output
    base = runner.invoke(cli, [*ARGS, "--faults=10", "--fault-rate=meta"])
    assert base.exit_code == 2 and "--fault-rate" in base.output
