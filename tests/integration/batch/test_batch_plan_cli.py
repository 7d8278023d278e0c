"""``gpuops batch plan`` through click: the shipped example's plan, refusals naming the field."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "batch"
OPERATION = EXAMPLES / "driver-upgrade.operation.yaml"
NODES = EXAMPLES / "nodes.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["batch", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_plan_of_the_shipped_example() -> None:
    code, out, _ = run("plan", str(OPERATION), "--nodes", str(NODES))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == (
        "operation driver-550 (dry-run: nothing runs, each step is audited): 48 nodes in 16"
        " waves, 2 skipped"
    )
    assert lines[1] == (
        "max_unavailable 10% of 50 nodes = 5; unavailable before: 2 (gpu-017, gpu-033)"
    )
    assert lines[2] == (
        "wave 0 (canary): gpu-001, gpu-002 — unavailable 4/5, GPUs available 368/400, at +0s"
        " for 16m10s"
    )
    assert "skipped gpu-033: down (not responding)" in lines
    assert "skipped gpu-042: skip label gpuops.io/batch-skip" in lines
    assert "gpu-017 was out of service before: it stays so after" in lines
    assert lines[-1] == "expected duration: 4h18m40s"


def test_plan_as_json_never_exceeds_the_budget() -> None:
    code, out, _ = run("plan", str(OPERATION), "--nodes", str(NODES), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["max_unavailable"] == 5
    assert max(w["unavailable"] for w in doc["waves"]) == 5
    planned = [n for w in doc["waves"] for n in w["nodes"]]
    assert len(planned) == len(set(planned)) == 48


def test_inventory_that_does_not_match_is_refused(tmp_path: Path) -> None:
    for name in ("driver-upgrade.yml", "reboot.yml"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    (tmp_path / "inventory.yaml").write_text("all:\n  hosts:\n    gpu-001:\n")
    op = tmp_path / "op.yaml"
    op.write_text(OPERATION.read_text())
    code, out, err = run("plan", str(op), "--nodes", str(NODES))
    assert code == 1
    assert out.startswith(
        f"{op}: step.inventory: {tmp_path / 'inventory.yaml'} does not match the targets: it"
        " lacks gpu-002, gpu-003,"
    )
    assert err == "1 problem: nothing runs\n"


def test_selector_matching_every_node_needs_all(tmp_path: Path) -> None:
    op = tmp_path / "op.yaml"
    op.write_text("operation: x\ntargets: {features: [ib]}\nstep: {command: [/bin/true]}\n")
    code, out, _ = run("plan", str(op), "--nodes", str(NODES))
    assert code == 1
    assert out == (
        f"{op}: targets: features ib matches every node of the fleet (54); say `all: true`"
        " under targets to mean it\n"
    )
