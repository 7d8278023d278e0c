"""``gpuops whatif --batch``: an operation file read as a rollout of the simulated fleet —
its targets and waves as ``gpuops batch plan`` plans them over the fleet file's nodes, its
timing per phase, the driver version its step installs — and refused, naming the field, as
the plan refuses it; ``gpuops fleet run --batch`` rolls it over a run without policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sim.fleet.config import FleetConfig, PoolSpec
from gpuops.sim.whatif.batch import rollout_spec
from gpuops.sim.whatif.errors import WhatifError

FLEET = FleetConfig(pools=(PoolSpec("a100", nodes=4), PoolSpec("h100", nodes=2)))
OPERATION = """\
operation: driver-560
targets: {pool: a100}
step:
  ansible: upgrade.yml
  inventory: hosts.yaml
  extra_vars: {driver_version: "560.35.03"}
reboot: {ansible: reboot.yml}
canary: 1
max_parallel: 2
max_unavailable: 50%
timing: {quarantine: 2m, step: 8m, reboot: 5m, validate: 1m}
"""


def write(tmp_path: Path, text: str) -> Path:
    for name in ("upgrade.yml", "reboot.yml", "hosts.yaml"):
        (tmp_path / name).write_text("---\n", encoding="utf-8")
    path = tmp_path / "op.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_an_operation_file_becomes_a_rollout_of_the_fleet_file_s_nodes(tmp_path: Path) -> None:
    spec = rollout_spec(write(tmp_path, OPERATION), FLEET, 2.0)
    assert spec.targets == ("node-0", "node-1", "node-2", "node-3")  # the a100 pool's
    assert (spec.at_s, spec.canary, spec.max_parallel) == (7200.0, 1, 2)
    assert (spec.budget, spec.counted, spec.drain) == (2, "a100", True)  # 50% of 4 nodes
    assert (spec.quarantine_s, spec.step_s, spec.reboot_s) == (120.0, 480.0, 300.0)
    assert spec.validate_s == 0.0  # the operation validates nothing
    assert spec.driver_version == "560.35.03"


def test_what_the_plan_refuses_the_what_if_refuses_naming_the_field(tmp_path: Path) -> None:
    nothing = write(tmp_path, OPERATION.replace("pool: a100", "pool: v100"))
    with pytest.raises(WhatifError, match=r"--batch .*op\.yaml: targets: pool v100 matches no"):
        rollout_spec(nothing, FLEET, 1.0)
    typo = write(tmp_path, OPERATION.replace("canary: 1", "canry: 1"))
    with pytest.raises(WhatifError, match=r"--batch: .*op\.yaml:8: canry: unknown key"):
        rollout_spec(typo, FLEET, 1.0)


def test_fleet_run_rolls_it_without_policies_and_says_what_it_cost() -> None:
    repo = Path(__file__).resolve().parents[3]
    args = [
        "--log-level=warning",
        "fleet",
        "run",
        "--fleet",
        str(repo / "examples/fleets/demo.yaml"),
    ]
    args += ["--hours=1.5", "--batch", str(repo / "examples/batch/demo-driver.operation.yaml")]
    result = CliRunner().invoke(cli, [*args, "--batch-at=0.25", "--json"])
    assert result.exit_code == 0, result.output
    rollout = json.loads(result.stdout)["rollout"]
    assert (rollout["done"], rollout["most_out"], rollout["budget"]) == (
        ["node-0", "node-1", "node-2", "node-3"],
        2,
        2,
    )
    assert rollout["duration_s"] == 2925.0  # three waves of 16m10s, each ended at a 15 s step
    assert rollout["gpu_hours_out"] == 4 * 4 * 975.0 / 3600
    assert rollout["requeued"] + rollout["moved"] > 0
    late = CliRunner().invoke(cli, [*args, "--batch-at=1.5"])
    assert late.exit_code == 2 and "1.5 h is not within the run's 1.5 virtual hours" in late.output
