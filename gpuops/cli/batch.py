"""``gpuops batch plan``: a batch operation's plan over a fleet, printed before anything runs.

A thin front over ``gpuops.model.batch`` (the operation file, the nodes file, the plan) and
``gpuops.integrations.ansible.inventory`` (the step's inventory must hold every target). Problems
are printed one per line (``FILE:LINE: field: message`` for a file, ``field: message`` for the
plan); exit 0 when the operation can run, 1 when not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from gpuops.model.batch.nodefile import load_nodes
from gpuops.model.batch.opfile import load_operation
from gpuops.model.batch.plan import Plan, PlanError, plan
from gpuops.model.rules.durations import format_duration
from gpuops.model.rules.model import RulesError


def _refuse(problems: list[str]) -> None:
    for problem in problems:
        click.echo(problem)
    count = len(problems)
    click.echo(f"{count} problem{'s' if count != 1 else ''}: nothing runs", err=True)
    sys.exit(1)


def _plan_of(operation_file: Path, nodes_file: Path) -> Plan:
    from gpuops.integrations.ansible.inventory import InventoryError, inventory_hosts

    try:
        operation = load_operation(operation_file)
        fleet = load_nodes(nodes_file)
    except RulesError as exc:
        _refuse([str(e) for e in exc.errors])
    inventory = None
    if operation.step.inventory is not None:
        try:
            inventory = inventory_hosts(Path(operation.step.inventory))
        except InventoryError as exc:
            _refuse([f"{operation.file}: step.inventory: {exc}"])
    try:
        return plan(operation, fleet, inventory)
    except PlanError as exc:
        _refuse([f"{operation.file}: {p}" for p in exc.problems])
    raise AssertionError("unreachable")  # _refuse exits


def plan_document(made: Plan) -> dict[str, Any]:
    """The plan as JSON (``--json``)."""
    op = made.operation
    return {
        "operation": op.name,
        "enforce": op.enforce,
        "approval": op.approval,
        "targets": list(made.targets),
        "skipped": [{"node": s.node, "why": s.why} for s in made.skipped],
        "counted": made.counted,
        "max_unavailable": made.budget,
        "already_unavailable": list(made.already_unavailable),
        "kept_drained": list(made.kept_drained),
        "gpus_total": made.gpus_total,
        "waves": [
            {
                "index": w.index,
                "canary": w.canary,
                "nodes": list(w.nodes),
                "unavailable": w.unavailable,
                "gpus_available": w.gpus_available,
                "start_s": w.start_s,
                "duration_s": w.duration_s,
            }
            for w in made.waves
        ],
        "duration_s": made.duration_s,
    }


def _print(made: Plan) -> None:
    op = made.operation
    mode = "enforced" if op.enforce else "dry-run: nothing runs, each step is audited"
    approval = "; waits for an approval" if op.approval else ""
    click.echo(
        f"operation {op.name} ({mode}{approval}): {len(made.targets)} nodes in"
        f" {len(made.waves)} waves, {len(made.skipped)} skipped"
    )
    before = ", ".join(made.already_unavailable) or "none"
    click.echo(
        f"max_unavailable {op.max_unavailable.describe()} of {made.counted} nodes ="
        f" {made.budget}; unavailable before: {len(made.already_unavailable)} ({before})"
    )
    for w in made.waves:
        canary = " (canary)" if w.canary else ""
        click.echo(
            f"wave {w.index}{canary}: {', '.join(w.nodes)} — unavailable"
            f" {w.unavailable}/{made.budget}, GPUs available {w.gpus_available}/{made.gpus_total},"
            f" at +{format_duration(w.start_s)} for {format_duration(w.duration_s)}"
        )
    for s in made.skipped:
        click.echo(f"skipped {s.node}: {s.why}")
    for name in made.kept_drained:
        click.echo(f"{name} was out of service before: it stays so after")
    click.echo(f"expected duration: {format_duration(made.duration_s)}")


@click.group(name="batch")
def batch() -> None:
    """Batch operations: a driver upgrade or a reboot rolled across nodes (docs/batch.md)."""


@batch.command("plan")
@click.argument("operation_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--nodes",
    "nodes_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The fleet as a nodes file (nodes: name, pool, gpus, features, labels, state).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
def plan_cmd(operation_file: Path, nodes_file: Path, as_json: bool) -> None:
    """Print OPERATION_FILE's plan over the fleet: the waves (the canary first), the nodes
    unavailable and GPUs kept available in each, the nodes skipped and why, the expected
    duration. Refuses, naming the field, an operation that cannot run."""
    made = _plan_of(operation_file, nodes_file)
    if as_json:
        click.echo(json.dumps(plan_document(made)))
    else:
        _print(made)
