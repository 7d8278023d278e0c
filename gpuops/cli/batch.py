"""``gpuops batch plan|run|status|resume|cancel|retry``: a batch operation's plan, printed
before anything runs, and its run through an engine built from its configuration.

A thin front over ``gpuops.model.batch`` (the operation file, the nodes file, the plan),
``gpuops.integrations.ansible.inventory`` (the step's inventory must hold every target) and the
engine's batch runner (``gpuops.runtime.batch``: every step through the engine's gate, its
state in the engine's state store). The fleet comes from a nodes file (``--nodes``) or from
Slurm (``--slurm``). Problems are printed one per line (``FILE:LINE: field: message`` for a
file, ``field: message`` for the plan); exit 0 when the operation can run (or ran), 1 when not.
"""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuops.model.batch.nodefile import load_nodes
from gpuops.model.batch.operation import Availability, FleetNode, Operation
from gpuops.model.batch.opfile import load_operation
from gpuops.model.batch.plan import Plan, PlanError, plan
from gpuops.model.rules.durations import format_duration
from gpuops.model.rules.model import RulesError

if TYPE_CHECKING:
    from gpuops.runtime.batch import BatchRecord, FleetView
    from gpuops.runtime.facade import Engine


def _refuse(problems: list[str]) -> None:
    for problem in problems:
        click.echo(problem)
    count = len(problems)
    click.echo(f"{count} problem{'s' if count != 1 else ''}: nothing runs", err=True)
    sys.exit(1)


def _inventory(operation: Operation) -> frozenset[str] | None:
    from gpuops.integrations.ansible.inventory import InventoryError, inventory_hosts

    if operation.step.inventory is None:
        return None
    try:
        return inventory_hosts(Path(operation.step.inventory))
    except InventoryError as exc:
        _refuse([f"{operation.file}: step.inventory: {exc}"])
    raise AssertionError("unreachable")  # _refuse exits


def _operation(operation_file: Path) -> Operation:
    try:
        return load_operation(operation_file)
    except RulesError as exc:
        _refuse([str(e) for e in exc.errors])
    raise AssertionError("unreachable")


def _plan_of(operation_file: Path, fleet: FleetView) -> Plan:
    operation = _operation(operation_file)
    try:
        return plan(operation, fleet.nodes(), _inventory(operation))
    except PlanError as exc:
        _refuse([f"{operation.file}: {p}" for p in exc.problems])
    raise AssertionError("unreachable")  # _refuse exits


class NodesFile:
    """The fleet as a nodes file says it is."""

    def __init__(self, path: Path) -> None:
        try:
            self._nodes = load_nodes(path)
        except RulesError as exc:
            _refuse([str(e) for e in exc.errors])

    def nodes(self) -> Sequence[FleetNode]:
        return self._nodes


class SlurmFleet:
    """The fleet as Slurm says it is now (``sinfo --json``): a node's first partition is its
    pool, its features and GPUs (gres) as configured; drained or draining is out of service
    (by its reason's hand), down or powered down is down."""

    def __init__(self, conf: str | None) -> None:
        from gpuops.integrations.slurm.client import SlurmClient

        self._client = SlurmClient(conf=conf)

    def nodes(self) -> Sequence[FleetNode]:
        from gpuops.integrations.slurm.client import SlurmError, gres_gpus
        from gpuops.integrations.slurm.nodes import node_state

        try:
            found = self._client.nodes()
        except SlurmError as exc:
            raise click.ClickException(f"--slurm: {exc}") from None
        nodes = []
        for node in found:
            state = node_state(node)
            availability = Availability.UP
            if state in ("drained", "draining"):
                availability = Availability.DRAINED
            elif state in ("down", "powered_down", "powering_down"):
                availability = Availability.DOWN
            features = node.get("features") or node.get("active_features") or []
            if isinstance(features, str):
                features = [f for f in features.split(",") if f]
            partitions = node.get("partitions") or [""]
            nodes.append(
                FleetNode(
                    name=str(node.get("name")),
                    pool=str(partitions[0]),
                    gpus=gres_gpus(str(node.get("gres") or "")),
                    features=frozenset(str(f) for f in features),
                    availability=availability,
                    reason=str(node.get("reason") or ""),
                )
            )
        return nodes


def _fleet(nodes_file: Path | None, slurm: bool, slurm_conf: str | None) -> FleetView:
    if (nodes_file is None) == (not slurm and slurm_conf is None):
        raise click.UsageError("give the fleet: --nodes FILE or --slurm")
    if nodes_file is not None:
        return NodesFile(nodes_file)
    return SlurmFleet(slurm_conf)


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


_NODES = click.option(
    "--nodes",
    "nodes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The fleet as a nodes file (nodes: name, pool, gpus, features, labels, state).",
)
_SLURM = click.option(
    "--slurm", is_flag=True, help="The fleet as Slurm says it is now (sinfo --json)."
)
_SLURM_CONF = click.option(
    "--slurm-conf",
    default=None,
    help="slurm.conf for --slurm (default: Slurm's own, /etc/slurm/slurm.conf).",
)
_CONFIG = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The engine configuration: its state store, audit spool, executors and dry-run.",
)


@batch.command("plan")
@click.argument("operation_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_NODES
@_SLURM
@_SLURM_CONF
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
def plan_cmd(
    operation_file: Path,
    nodes_file: Path | None,
    slurm: bool,
    slurm_conf: str | None,
    as_json: bool,
) -> None:
    """Print OPERATION_FILE's plan over the fleet: the waves (the canary first), the nodes
    unavailable and GPUs kept available in each, the nodes skipped and why, the expected
    duration. Refuses, naming the field, an operation that cannot run."""
    made = _plan_of(operation_file, _fleet(nodes_file, slurm, slurm_conf))
    if as_json:
        click.echo(json.dumps(plan_document(made)))
    else:
        _print(made)


@contextmanager
def _engine(config_path: Path) -> Iterator[Engine]:
    """An engine of the configuration, not started: its store, audit spool, gate and
    executors, for the batch runner; stopped (its audit flushed) on the way out."""
    from gpuops.audit.errors import SpoolLockedError
    from gpuops.runtime.facade import Engine
    from gpuops.settings import ConfigError, load_config
    from gpuops.store.errors import StateError

    try:
        engine = Engine(load_config(config_path))
    except (ConfigError, StateError) as exc:
        raise click.ClickException(str(exc)) from None
    except SpoolLockedError as exc:
        raise click.ClickException(
            f"{exc}: an engine of {config_path} is running; gpuops batch runs the operation"
            " with the engine's state and audit itself, so stop the engine first"
        ) from None
    try:
        yield engine
    finally:
        engine.stop()


def _report(engine: Engine, rec: BatchRecord) -> None:
    nodes = engine.batches.nodes(rec.id)
    counts: dict[str, int] = {}
    for node in nodes.values():
        counts[node.status] = counts.get(node.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    why = f" ({rec.why})" if rec.why else ""
    click.echo(f"batch {rec.id}: {rec.status}{why}; {rec.waves} waves; {summary}")
    for name in rec.order:
        node = nodes[name]
        if node.error:
            click.echo(f"  {name}: {node.status}: {node.error}")


def _drive(engine: Engine, batch_id: str, fleet: FleetView) -> None:
    from gpuops.runtime.batch import BatchStatus

    rec = engine.batches.run(batch_id, fleet)
    _report(engine, rec)
    if rec.status != BatchStatus.DONE:
        sys.exit(1)


@batch.command("run")
@click.argument("operation_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_CONFIG
@_NODES
@_SLURM
@_SLURM_CONF
def run_cmd(
    operation_file: Path,
    config_path: Path,
    nodes_file: Path | None,
    slurm: bool,
    slurm_conf: str | None,
) -> None:
    """Run OPERATION_FILE: store it in the engine's state, then its waves, every step through
    the engine's gate (dry-run unless the operation says enforce: true). Exit 0 when it is
    done, 1 when it paused (the kill switch, pause, the failure threshold, no room)."""
    operation = _operation(operation_file.resolve())  # resumed from any folder
    inventory = _inventory(operation)
    fleet = _fleet(nodes_file, slurm, slurm_conf)
    with _engine(config_path) as engine:
        try:
            batch_id = engine.batches.start(
                operation,
                operation_file.read_text(encoding="utf-8"),
                fleet,
                inventory,
                by=getpass.getuser(),
            )
        except PlanError as exc:
            _refuse([f"{operation.file}: {p}" for p in exc.problems])
        click.echo(f"batch {batch_id} started")
        _drive(engine, batch_id, fleet)


@batch.command("status")
@click.argument("batch_id", required=False)
@_CONFIG
def status_cmd(batch_id: str | None, config_path: Path) -> None:
    """Print each operation (or BATCH_ID's), its nodes that failed or were skipped and why."""
    from gpuops.runtime.batch import BatchError

    with _engine(config_path) as engine:
        try:
            ids = [batch_id] if batch_id else [b.id for b in engine.store.batches()]
            for one in ids:
                _report(engine, engine.batches.record(one))
        except BatchError as exc:
            raise click.ClickException(str(exc)) from None


@batch.command("resume")
@click.argument("batch_id")
@_CONFIG
@_NODES
@_SLURM
@_SLURM_CONF
def resume_cmd(
    batch_id: str,
    config_path: Path,
    nodes_file: Path | None,
    slurm: bool,
    slurm_conf: str | None,
) -> None:
    """Go on with a paused (or interrupted) operation: a node in the middle of its procedure
    from its next step, never a finished step again."""
    from gpuops.runtime.batch import BatchError

    fleet = _fleet(nodes_file, slurm, slurm_conf)
    with _engine(config_path) as engine:
        try:
            engine.batches.resume(batch_id)
        except BatchError as exc:
            raise click.ClickException(str(exc)) from None
        _drive(engine, batch_id, fleet)


@batch.command("cancel")
@click.argument("batch_id")
@_CONFIG
def cancel_cmd(batch_id: str, config_path: Path) -> None:
    """Stop an operation: no node starts again, a node in the middle of its procedure is
    returned to service, a failed one is left out of service."""
    from gpuops.runtime.batch import BatchError

    with _engine(config_path) as engine:
        try:
            _report(engine, engine.batches.cancel(batch_id))
        except BatchError as exc:
            raise click.ClickException(str(exc)) from None


@batch.command("approve")
@click.argument("batch_id")
@_CONFIG
@click.option("--user", default=None, help="Who approves (default: the user running this).")
def approve_cmd(batch_id: str, config_path: Path, user: str | None) -> None:
    """Let an operation that says approval: true run (audited with the approver); `resume`
    runs it."""
    from gpuops.runtime.batch import BatchError

    with _engine(config_path) as engine:
        try:
            engine.batches.approve(batch_id, user or getpass.getuser())
        except BatchError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"batch {batch_id} approved: gpuops batch resume {batch_id}")


@batch.command("retry")
@click.argument("batch_id")
@click.argument("node")
@_CONFIG
def retry_cmd(batch_id: str, node: str, config_path: Path) -> None:
    """Put a failed NODE back in BATCH_ID's queue (its procedure from the start); `resume`
    runs it."""
    from gpuops.runtime.batch import BatchError

    with _engine(config_path) as engine:
        try:
            engine.batches.retry(batch_id, node)
        except BatchError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"{node} of batch {batch_id} queued again: gpuops batch resume {batch_id}")
