"""`gpuops whatif`: one seeded workload twice, policies off and on, compared (docs/whatif.md).

A thin front over ``gpuops.sim.whatif`` (the runs), ``gpuops.sim.whatif_report`` (table, JSON) and
``gpuops.sim.whatif_plots`` (PNG); logging is configured by ``gpuops.cli``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from gpuops.cli.fleet import FLEET_FILE
from gpuops.model.rules.model import RulesError
from gpuops.sim.fleet.errors import FleetError
from gpuops.sim.fleet.fleetfile import FleetFileError, load_fleet, with_listeners
from gpuops.sim.fleet.remotewrite import RemoteWriteError
from gpuops.sim.whatif import SCRAPE_INTERVAL_S, WhatifError
from gpuops.sim.whatif import whatif as run_whatif
from gpuops.sim.whatif.report import table, to_json

log = logging.getLogger(__name__)


@click.command(name="whatif")
@FLEET_FILE
@click.option(
    "--rules",
    "rules",
    required=True,
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Rule file or directory of the policies-on run (repeat for several).",
)
@click.option(
    "--hours",
    default=24.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True, max=24 * 14),
    help="Virtual hours of each run.",
)
@click.option("--seed", default=None, type=int, help="Seed of the workload (default: the file's).")
@click.option(
    "--scrape-interval",
    default=SCRAPE_INTERVAL_S,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Virtual seconds between two samples of every series written to Prometheus (every "
    "window the rules read must span two; the figures are observed every 30 s, or at every "
    "scrape if more often).",
)
@click.option(
    "--prometheus-url",
    default=None,
    help="A Prometheus with --web.enable-remote-write-receiver and no data of its own "
    "(default: one started for the run on a free loopback port).",
)
@click.option(
    "--workdir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the engine's state file, its audit spool (every decision of the on run) and "
    "Prometheus' data here (default: a temporary directory, removed).",
)
@click.option(
    "--all-series",
    is_flag=True,
    help="Write every series of the fleet to Prometheus (for dashboards on the kept data, "
    "with --workdir or --prometheus-url); default: only the metrics the rules read.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option(
    "--plots",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Write utilization.png, queue.png and power.png (off vs on) into this directory.",
)
def whatif(
    fleet_file: Path,
    rules: tuple[Path, ...],
    hours: float,
    seed: int | None,
    scrape_interval: float,
    prometheus_url: str | None,
    workdir: Path | None,
    all_series: bool,
    as_json: bool,
    plots: Path | None,
) -> None:
    """Run a fleet file's workload twice in virtual time — without policies, and with the
    engine evaluating RULES against a real Prometheus and acting on the fleet — and compare
    utilization, allocation, job completion and queue wait, preemptions, reclaims, energy and
    its cost, overall, per priority class and per project."""
    try:
        config = load_fleet(fleet_file)
    except FleetFileError as exc:
        raise click.ClickException(str(exc)) from None
    if seed is not None:
        config = with_listeners(config, seed=seed)

    def progress(run: str, t: float) -> None:
        log.info("policies %s: %.0f of %g virtual hours", run, t / 3600.0, hours)

    try:
        result = run_whatif(
            config,
            list(rules),
            hours,
            prometheus_url=prometheus_url,
            workdir=workdir,
            scrape_interval_s=scrape_interval,
            progress=progress,
            all_series=all_series,
        )
    except RulesError as exc:
        raise click.ClickException(f"rules not loaded: {exc}") from None
    except FleetError as exc:
        raise click.ClickException(f"the fleet cannot start: {exc.message}") from None
    except (WhatifError, RemoteWriteError) as exc:
        raise click.ClickException(str(exc)) from None
    if plots is not None:
        from gpuops.sim.whatif.plots import plot  # matplotlib: imported only for --plots

        for path in plot(result, plots):
            log.info("plot: %s", path)
    click.echo(json.dumps(to_json(result), indent=2) if as_json else table(result))
