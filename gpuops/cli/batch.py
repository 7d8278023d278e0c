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
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuops.cli.api_client import api_options, client, remote_call
from gpuops.model.batch.nodefile import load_nodes
from gpuops.model.batch.operation import FleetNode, Operation
from gpuops.model.batch.opfile import load_operation
from gpuops.model.batch.plan import Plan, PlanError, plan
from gpuops.model.rules.durations import format_duration
from gpuops.model.rules.model import RulesError

F = TypeVar("F", bound=Callable[..., Any])

FOLLOW_S = 1.0
"""How often ``--wait`` asks the engine how the operation goes."""

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


def _fleet(nodes_file: Path | None, slurm: bool, slurm_conf: str | None) -> FleetView:
    """The fleet ``--nodes`` or ``--slurm`` names, read once here so that a bad nodes file is
    refused (every problem with its line) before anything runs."""
    from gpuops.runtime.fleets import FleetError, NodesFile, SlurmFleet

    if (nodes_file is None) == (not slurm and slurm_conf is None):
        raise click.UsageError("give the fleet: --nodes FILE or --slurm")
    if nodes_file is not None:
        try:
            nodes = load_nodes(nodes_file)
        except RulesError as exc:
            _refuse([str(e) for e in exc.errors])
        return _Read(NodesFile(nodes_file), nodes)
    fleet = SlurmFleet(slurm_conf)
    try:
        return _Read(fleet, fleet.nodes())
    except FleetError as exc:
        raise click.ClickException(f"--slurm: {exc}") from None


class _Read:
    """A fleet as first read (the plan's), then as it is at each later reading (each wave's)."""

    def __init__(self, fleet: FleetView, first: Sequence[FleetNode]) -> None:
        self._fleet = fleet
        self._first: Sequence[FleetNode] | None = first

    def nodes(self) -> Sequence[FleetNode]:
        first, self._first = self._first, None
        return first if first is not None else self._fleet.nodes()


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
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Run it in this process, with this engine configuration's state store, audit spool,"
    " executors and dry-run, no engine running (default: ask the engine's API).",
)


def _remote(func: F) -> F:
    """The engine API's options (``--url``, ``--token``...: ``gpuops.cli.api_client``)."""
    return api_options(func)


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


class _Local:
    """An engine of the configuration, not started, in this process: its store, audit spool,
    gate and executors, for the batch runner; stopped (its audit flushed) on the way out."""

    def __init__(self, config_path: Path, changes: bool = True) -> None:
        """``changes``: the command changes an operation (all but ``status``): refused on a
        PostgreSQL state, whose replicas elect the one that acts."""
        from gpuops.audit.errors import SpoolLockedError
        from gpuops.runtime.facade import Engine
        from gpuops.settings import ConfigError, load_config
        from gpuops.store.errors import StateError

        try:
            self.engine = Engine(load_config(config_path))
        except (ConfigError, StateError) as exc:
            raise click.ClickException(str(exc)) from None
        except SpoolLockedError as exc:
            raise click.ClickException(
                f"{exc}: an engine of {config_path} is running; ask it (--url, GPUOPS_URL)"
                " instead of --config, or stop it first"
            ) from None
        if changes and not self.engine.leadership.solo:
            self.engine.stop()
            raise click.ClickException(
                f"{config_path}: its state is PostgreSQL, shared by replicas that elect the one"
                " that acts: ask the engine (--url, GPUOPS_URL) instead of --config"
            )

    def __enter__(self) -> Engine:
        return self.engine

    def __exit__(self, *_: object) -> None:
        self.engine.stop()


def _say(batch: Mapping[str, Any]) -> None:
    """An operation as the API tells it (``BatchOut``): its status, why, its nodes counted by
    status, and each node's error."""
    counts: dict[str, int] = {}
    for node in batch["nodes"]:
        counts[node["status"]] = counts.get(node["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    why = f" ({batch['why']})" if batch["why"] else ""
    click.echo(f"batch {batch['id']}: {batch['status']}{why}; {batch['waves']} waves; {summary}")
    for node in batch["nodes"]:
        if node["error"]:
            click.echo(f"  {node['name']}: {node['status']}: {node['error']}")


def _told(engine: Engine, rec: BatchRecord) -> dict[str, Any]:
    """A stored operation as the API tells it."""
    nodes = engine.batches.nodes(rec.id)
    return {
        "id": rec.id,
        "status": rec.status,
        "why": rec.why,
        "waves": rec.waves,
        "nodes": [
            {"name": name, "status": nodes[name].status, "error": nodes[name].error}
            for name in rec.order
            if name in nodes
        ],
    }


def _ended(batch: Mapping[str, Any]) -> None:
    """Exit 0 when the operation is done, 1 when it paused or was cancelled."""
    if batch["status"] != "done":
        sys.exit(1)


def _follow(kw: dict[str, Any], batch_id: str, as_json: bool) -> None:
    """Wait until the engine stops running the operation (done, paused, cancelled), then
    tell it."""
    api = client(kw.pop("url"), kw.pop("token"), kw.pop("ca_file"), kw.pop("insecure"))
    try:
        while True:
            batch = api.call("GET", f"/batch/{batch_id}")
            if batch["status"] != "running":
                break
            time.sleep(FOLLOW_S)
    finally:
        api.close()
    click.echo(json.dumps(batch)) if as_json else _say(batch)
    _ended(batch)


def _local_only(nodes_file: Path | None, slurm: bool, slurm_conf: str | None) -> None:
    if nodes_file is not None or slurm or slurm_conf is not None:
        raise click.UsageError(
            "--nodes and --slurm name the fleet of a run in this process (--config); the"
            " engine plans over the fleet its configuration names (batch.nodes, batch.slurm)"
        )


def _asked(what: Callable[[], BatchRecord]) -> BatchRecord:
    """``what`` done, or its ``BatchError`` (an unknown operation, a bad state) said."""
    from gpuops.runtime.batch import BatchError

    try:
        return what()
    except BatchError as exc:
        raise click.ClickException(str(exc)) from None


@batch.command("run")
@click.argument("operation_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_CONFIG
@_NODES
@_SLURM
@_SLURM_CONF
@click.option("--wait", is_flag=True, help="Ask the engine, then wait until it is done or paused.")
@_remote
def run_cmd(
    operation_file: Path,
    config_path: Path | None,
    nodes_file: Path | None,
    slurm: bool,
    slurm_conf: str | None,
    wait: bool,
    as_json: bool,
    **kw: Any,
) -> None:
    """Run OPERATION_FILE: the engine's leader stores it and runs its waves, every step
    through its gate (dry-run unless the operation says enforce: true); --wait follows it.
    With --config, this process runs it instead, with no engine running. Exit 0 when it is
    started (or done), 1 when it paused (the kill switch, pause, the failure threshold, no
    room) or cannot run."""
    operation = _operation(operation_file.resolve())  # resumed from any folder
    inventory = _inventory(operation)
    if config_path is None:
        _local_only(nodes_file, slurm, slurm_conf)
        body = {
            "operation": operation_file.read_text(encoding="utf-8"),
            "file": str(operation_file),
            "folder": str(operation_file.resolve().parent),
        }
        api = client(kw["url"], kw["token"], kw["ca_file"], kw["insecure"])
        try:
            started = api.call("POST", "/batch", json_body=body)
        finally:
            api.close()
        click.echo(f"batch {started['id']} started: the engine runs it")
        if wait:
            _follow(kw, started["id"], as_json)
        return
    fleet = _fleet(nodes_file, slurm, slurm_conf)
    with _Local(config_path) as engine:
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
        told = _told(engine, engine.batches.run(batch_id, fleet))
    click.echo(json.dumps(told)) if as_json else _say(told)
    _ended(told)


@batch.command("status")
@click.argument("batch_id", required=False)
@_CONFIG
@_remote
def status_cmd(batch_id: str | None, config_path: Path | None, as_json: bool, **kw: Any) -> None:
    """Print each operation (or BATCH_ID's), its nodes that failed or were skipped and why."""
    if config_path is None:
        found = remote_call(kw, "GET", f"/batch/{batch_id}" if batch_id else "/batch")
        told = [found] if batch_id else found
    else:
        with _Local(config_path, changes=False) as engine:
            ids = [batch_id] if batch_id else [b.id for b in engine.batches.stored()]
            told = [_told(engine, _asked(partial(engine.batches.record, i))) for i in ids]
    if as_json:
        click.echo(json.dumps(told))
        return
    for one in told:
        _say(one)


def _act(
    config_path: Path | None,
    kw: dict[str, Any],
    path: str,
    local: Callable[[Engine], BatchRecord],
) -> dict[str, Any]:
    """One change of an operation: through the engine's API (POST ``path``), or in this
    process with --config; the operation as it is after it."""
    if config_path is None:
        answer: dict[str, Any] = remote_call(kw, "POST", path)
        return answer
    with _Local(config_path) as engine:
        return _told(engine, _asked(partial(local, engine)))


@batch.command("resume")
@click.argument("batch_id")
@_CONFIG
@_NODES
@_SLURM
@_SLURM_CONF
@click.option("--wait", is_flag=True, help="Ask the engine, then wait until it is done or paused.")
@_remote
def resume_cmd(
    batch_id: str,
    config_path: Path | None,
    nodes_file: Path | None,
    slurm: bool,
    slurm_conf: str | None,
    wait: bool,
    as_json: bool,
    **kw: Any,
) -> None:
    """Go on with a paused (or interrupted) operation, past the nodes failed so far: a node
    in the middle of its procedure from its next step, never a finished step again."""
    if config_path is None:
        _local_only(nodes_file, slurm, slurm_conf)
        told = remote_call(dict(kw), "POST", f"/batch/{batch_id}/resume")
        click.echo(f"batch {batch_id} resumed: the engine runs it")
        if wait:
            _follow(kw, batch_id, as_json)
        elif as_json:
            click.echo(json.dumps(told))
        return
    fleet = _fleet(nodes_file, slurm, slurm_conf)
    with _Local(config_path) as engine:
        _asked(partial(engine.batches.resume, batch_id))
        told = _told(engine, engine.batches.run(batch_id, fleet))
    click.echo(json.dumps(told)) if as_json else _say(told)
    _ended(told)


@batch.command("cancel")
@click.argument("batch_id")
@_CONFIG
@_remote
def cancel_cmd(batch_id: str, config_path: Path | None, as_json: bool, **kw: Any) -> None:
    """Stop an operation: no node starts again, a node in the middle of its procedure is
    returned to service, a failed one is left out of service."""
    told = _act(config_path, kw, f"/batch/{batch_id}/cancel", lambda e: e.batches.cancel(batch_id))
    click.echo(json.dumps(told)) if as_json else _say(told)


@batch.command("approve")
@click.argument("batch_id")
@_CONFIG
@click.option("--user", default=None, help="Who approves, with --config (default: you).")
@_remote
def approve_cmd(
    batch_id: str, config_path: Path | None, user: str | None, as_json: bool, **kw: Any
) -> None:
    """Let an operation that says approval: true run (audited with the approver): the engine
    runs it (with --config: `resume` runs it)."""
    told = _act(
        config_path,
        kw,
        f"/batch/{batch_id}/approve",
        lambda e: e.batches.approve(batch_id, user or getpass.getuser()),
    )
    if as_json:
        click.echo(json.dumps(told))
    elif config_path is None:
        click.echo(f"batch {batch_id} approved: the engine runs it")
    else:
        click.echo(f"batch {batch_id} approved: gpuops batch resume {batch_id}")


@batch.command("retry")
@click.argument("batch_id")
@click.argument("node")
@_CONFIG
@_remote
def retry_cmd(batch_id: str, node: str, config_path: Path | None, as_json: bool, **kw: Any) -> None:
    """Put a failed NODE back in BATCH_ID's queue (its procedure from the start); `resume`
    runs it."""

    def local(engine: Engine) -> BatchRecord:
        engine.batches.retry(batch_id, node)
        return engine.batches.record(batch_id)

    told = _act(config_path, kw, f"/batch/{batch_id}/retry/{node}", local)
    if as_json:
        click.echo(json.dumps(told))
    else:
        click.echo(f"{node} of batch {batch_id} queued again: gpuops batch resume {batch_id}")
