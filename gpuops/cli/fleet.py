"""`gpuops fleet` commands: `gpuops fleet sim` runs the simulated GPU fleet until Ctrl-C.

A thin front over ``gpuops.sim.fleet.FleetSim``; logging is configured by ``gpuops.cli``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import click

from gpuops.model.rules.durations import parse_duration
from gpuops.sim.fleet import (
    GPU_MODELS,
    FleetConfig,
    FleetError,
    FleetSim,
    PoolSpec,
    prometheus_config,
)
from gpuops.sim.fleet.fleetfile import FleetFileError, load_fleet, with_listeners
from gpuops.sim.fleet.remotewrite import RemoteWriteError, RemoteWriter
from gpuops.sim.fleet.report import Recorder, table
from gpuops.sim.fleet.rollout import RolloutSpec
from gpuops.sim.fleet.virtual import VirtualFleet
from gpuops.sim.whatif import CLUSTER_STEP_S, WhatifError, record_interval
from gpuops.sim.whatif.batch import rollout_spec

log = logging.getLogger(__name__)


@click.group(name="fleet")
def fleet() -> None:
    """The simulated GPU fleet: nodes, jobs, a queue and a control API."""


@fleet.command(name="sim")
@click.option(
    "--fleet",
    "fleet_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Fleet file (YAML: pools, projects, classes, job classes, tariff; see "
    "examples/fleets/). Replaces --nodes, --gpus-per-node, --pool, --model, --seed and "
    "--arrival-rate.",
)
@click.option("--nodes", default=4, show_default=True, help="Nodes at start.")
@click.option("--gpus-per-node", default=4, show_default=True, help="GPUs on every node.")
@click.option("--pool", default="default", show_default=True, help="Name of the node pool.")
@click.option(
    "--model",
    default="A100",
    show_default=True,
    type=click.Choice(sorted(GPU_MODELS)),
    help="GPU model of every node.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--advertise-host",
    default=None,
    help="Host written into the file_sd targets (default: --host), e.g. a container name.",
)
@click.option(
    "--control-port",
    default=9400,
    show_default=True,
    help="Port of the control API and the fleet /metrics (0: a free port).",
)
@click.option(
    "--first-node-port",
    default=9401,
    show_default=True,
    help="Node n serves /metrics on this port + n (0: free ports).",
)
@click.option(
    "--sd-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Prometheus file_sd JSON file kept current with the node targets (its folder is made; "
    "default: gpu-nodes.json in the state directory $XDG_STATE_HOME/gpuops, "
    "~/.local/state/gpuops when that is unset).",
)
@click.option(
    "--prometheus-config",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a complete prometheus.yml here that scrapes the fleet (via --sd-file) and "
    "the engine's metrics: `prometheus --config.file=FILE` then needs nothing else.",
)
@click.option(
    "--scrape-interval",
    default="15s",
    show_default=True,
    help="Scrape interval written into the Prometheus config (the shipped policies assume 15s).",
)
@click.option("--seed", default=42, show_default=True, help="Seed of every random choice.")
@click.option(
    "--arrival-rate",
    default=0.5,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Background job arrivals per minute (0: none).",
)
@click.option(
    "--speed",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Simulated seconds per real second.",
)
def sim(
    fleet_file: Path | None,
    nodes: int,
    gpus_per_node: int,
    pool: str,
    model: str,
    host: str,
    advertise_host: str | None,
    control_port: int,
    first_node_port: int,
    sd_file: str | None,
    prometheus_config: Path | None,
    scrape_interval: str,
    seed: int,
    arrival_rate: float,
    speed: float,
) -> None:
    """Run the simulated fleet until Ctrl-C."""
    listeners: dict[str, Any] = {
        "speed": speed,
        "host": host,
        "advertise_host": advertise_host,
        "control_port": control_port,
        "first_node_port": first_node_port,
        "sd_file": sd_file or str(state_dir() / "gpu-nodes.json"),
    }
    if fleet_file is None:
        config = FleetConfig(
            pools=(PoolSpec(pool, nodes, gpus_per_node, model),),
            seed=seed,
            arrival_rate_per_min=arrival_rate,
            **listeners,
        )
    else:
        try:
            config = with_listeners(load_fleet(fleet_file), **listeners)
        except FleetFileError as exc:
            raise click.ClickException(str(exc)) from None
    try:
        config.validate()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    try:
        parse_duration(scrape_interval)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--scrape-interval") from None
    try:
        fleet_sim = FleetSim(config)
    except FleetError as exc:  # e.g. an initial job that cannot be placed
        raise click.ClickException(f"the fleet cannot start: {exc.message}") from None
    try:
        fleet_sim.start()
    except OSError as exc:  # the control port
        raise click.ClickException(
            f"the fleet cannot listen on {host}:{control_port}: {exc.strerror}; choose another"
            " port with --control-port (0: a free port)"
        ) from None
    if taken := fleet_sim.unopened_nodes():  # a node would read as down from the start
        fleet_sim.stop()
        ports = ", ".join(f"{port} ({node})" for node, port in sorted(taken.items()))
        raise click.ClickException(
            f"the fleet's nodes cannot listen on {host}: port {ports} in use; choose another"
            " --first-node-port (node n listens on it + n; 0: free ports)"
        )
    with fleet_sim:
        for node, port in sorted(fleet_sim.node_ports.items()):
            log.info("node %s: http://%s:%d/metrics", node, fleet_sim.host, port)
        log.info("control API: %s/api/v1/state", fleet_sim.control_url)
        if prometheus_config is None:
            log.info(
                "file_sd: %s; Prometheus scrape config:\n%s",
                fleet_sim.sd_file,
                fleet_sim.scrape_config(scrape_interval),
            )
        else:
            _write_prometheus_config(prometheus_config, fleet_sim, scrape_interval)
        try:
            fleet_sim.failed.wait()
        except KeyboardInterrupt:
            log.info("stopping the fleet")
    if fleet_sim.error is not None:
        error = fleet_sim.error
        raise click.ClickException(f"the fleet's clock stopped: {type(error).__name__}: {error}")


def state_dir() -> Path:
    """Where ``fleet sim`` keeps its files unless told: ``$XDG_STATE_HOME/gpuops``, else
    ``~/.local/state/gpuops`` (the XDG base directory specification's default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuops"


def _write_prometheus_config(path: Path, fleet_sim: FleetSim, scrape_interval: str) -> None:
    control = f"{fleet_sim.host}:{fleet_sim.control_port}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prometheus_config(fleet_sim.sd_file, control, scrape_interval))
    log.info(
        "Prometheus config: %s; run: prometheus --config.file=%s --storage.tsdb.path=%s",
        path,
        path,
        path.parent / "prometheus",
    )


FLEET_FILE = click.option(
    "--fleet",
    "fleet_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Fleet file (examples/fleets/).",
)
"""``--fleet FILE``: the fleet file of ``gpuops fleet run`` and ``gpuops whatif``."""

BATCH_FILE = click.option(
    "--batch",
    "batch_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A batch operation file (docs/batch.md) rolled over the fleet: its nodes out of "
    "service for its timing's phases, wave after wave; the report says what it cost.",
)
BATCH_AT = click.option(
    "--batch-at",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Virtual hours into the run the --batch operation starts.",
)


def rollout_of(
    batch_file: Path | None, batch_at: float, config: FleetConfig, hours: float
) -> RolloutSpec | None:
    """The rollout of ``--batch`` (None without it), refused as ``gpuops batch plan``
    refuses the operation, and when it would start after the run."""
    if batch_file is None:
        return None
    if batch_at >= hours:
        raise click.BadParameter(
            f"{batch_at:g} h is not within the run's {hours:g} virtual hours",
            param_hint="--batch-at",
        )
    try:
        return rollout_spec(batch_file, config, batch_at)
    except WhatifError as exc:
        raise click.ClickException(str(exc)) from None


@fleet.command(name="run")
@FLEET_FILE
@click.option(
    "--hours",
    default=24.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Virtual hours to run.",
)
@click.option("--seed", default=None, type=int, help="Overrides the fleet file's seed.")
@click.option(
    "--scrape-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Virtual seconds between samples.",
)
@click.option(
    "--prometheus-url",
    default=None,
    help="Write every sample there (a Prometheus with --web.enable-remote-write-receiver), "
    "timestamped so that the run ends now.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@BATCH_FILE
@BATCH_AT
def run(
    fleet_file: Path,
    hours: float,
    seed: int | None,
    scrape_interval: float,
    prometheus_url: str | None,
    as_json: bool,
    batch_file: Path | None,
    batch_at: float,
) -> None:
    """Run a fleet file in virtual time, without policies, and report what it achieved:
    utilization, allocation, job completion and queue wait per class, energy and its cost.
    The baseline half of `gpuops whatif` (docs/whatif.md); with --batch, what a rollout
    costs the same workload."""
    try:
        config = load_fleet(fleet_file)
    except FleetFileError as exc:
        raise click.ClickException(str(exc)) from None
    if seed is not None:
        config = with_listeners(config, seed=seed)
    rollout = rollout_of(batch_file, batch_at, config, hours)
    recorder = Recorder()
    writer = RemoteWriter(prometheus_url) if prometheus_url else None
    start_ms = int((time.time() - hours * 3600) * 1000)
    try:
        # stepped and observed as the what-if's off run is, so that the baseline is the same
        # figure both ways (observed at other steps, it differs by up to 0.9 points)
        virtual = VirtualFleet(
            config,
            start_ms,
            writer,
            scrape_interval,
            step_s=CLUSTER_STEP_S,
            recorder=recorder,
            record_interval_s=record_interval(scrape_interval),
            rollout=rollout,
        )
    except FleetError as exc:
        raise click.ClickException(f"the fleet cannot start: {exc.message}") from None
    started = time.monotonic()
    try:
        for hour in range(1, math.ceil(hours) + 1):
            virtual.run_until(min(hour, hours) * 3600.0)
    except RemoteWriteError as exc:
        raise click.ClickException(str(exc)) from None
    report = recorder.report(virtual.cluster)
    log.info("%.1f virtual hours in %.1f s", hours, time.monotonic() - started)
    rolled = None if virtual.rollout is None else virtual.rollout.report
    if as_json:
        doc = report.to_json()
        if rolled is not None:
            doc["rollout"] = rolled.to_json()
        click.echo(json.dumps(doc, indent=2))
    else:
        lines = [] if rolled is None else ["", *(f"  {line}" for line in rolled.lines())]
        click.echo("\n".join([table(report), *lines]))


@fleet.command(name="from-history")
@click.argument(
    "history", type=click.Path(exists=True, dir_okay=False, path_type=Path), nargs=-1, required=True
)
@click.option(
    "--pool",
    "pools",
    multiple=True,
    required=True,
    help="PARTITION=MODEL:NODESxGPUS for every partition the jobs ran in (e.g. gpu=A100:16x8): "
    "accounting records the jobs, not the machines. A CSV trace without a pool column: "
    "default=MODEL:NODESxGPUS.",
)
@click.option(
    "--column",
    "columns",
    multiple=True,
    help="FIELD=COLUMN for a CSV trace whose columns are not Helios' (job_id, user, vc, gpu_num, "
    "node_num, state, submit_time, start_time, end_time); fields: job_id, user, project, gpus, "
    "nodes, state, submit, start, end, pool.",
)
@click.option(
    "--prometheus",
    metavar="URL",
    help="A Prometheus holding the NVML exporter's nvml_gpu_utilization_ratio and the "
    "allocation series gpuops_gpu_allocated{project, partition} over the history's window: "
    "each job class takes the utilization profile nearest its GPUs' (default: training).",
)
@click.option("--name", default="from-history", show_default=True, help="The fleet's name.")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the fleet file.",
)
def from_history(
    history: tuple[Path, ...],
    pools: tuple[str, ...],
    columns: tuple[str, ...],
    prometheus: str | None,
    name: str,
    out: Path,
) -> None:
    """Derive a fleet file from a cluster's job history — `sacct --json`, `sacct --parsable2`
    (with --format=JobID,User,Account,Partition,AllocTRES,NNodes,State,Submit,Start,End) or a
    job trace in CSV — and print how closely its policies-off run reproduces the history's
    allocation, queue wait and completion time over the same window (docs/whatif.md)."""
    from gpuops.sim.fromhistory import (
        calibrate,
        derive,
        fleet_yaml,
        measured_profiles,
        parse_pool,
        profile_table,
    )
    from gpuops.sim.history import HistoryError, column_map, read_history

    try:
        shapes = [parse_pool(p) for p in pools]
        mapping = column_map(columns)
        records = [
            r for path in history for r in read_history(path.read_text(), str(path), mapping)
        ]
        source = ", ".join(map(str, history))
        measured = measured_profiles(prometheus, records, shapes) if prometheus else {}
        doc = derive(records, shapes, name, source, measured)
        _config, calibration = calibrate(records, shapes, doc, source)
    except (HistoryError, FleetFileError) as exc:
        raise click.ClickException(str(exc)) from None
    out.write_text(fleet_yaml(doc))
    click.echo(f"fleet file: {out} ({len(records)} jobs, {len(doc['job_classes'])} job classes)")
    if prometheus:
        click.echo(f"utilization of the jobs' GPUs ({prometheus}, the history's window):")
        click.echo(profile_table(measured, doc))
    click.echo("calibration (policies off, the history's window):")
    click.echo(calibration.table())
