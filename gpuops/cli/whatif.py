"""`gpuops whatif`: one seeded workload twice, policies off and on, compared (docs/whatif.md).

A thin front over ``gpuops.sim.whatif`` (the runs), ``gpuops.sim.whatif.report`` (table, JSON),
``gpuops.sim.whatif.spread`` (several seeds: medians and ranges) and ``gpuops.sim.whatif.plots``
(PNG); logging is configured by ``gpuops.cli``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import click

from gpuops.cli.fleet import BATCH_AT, BATCH_FILE, FLEET_FILE, rollout_of
from gpuops.model.rules.durations import parse_duration
from gpuops.model.rules.model import RulesError
from gpuops.sim.faults import RATE_BASES, FaultRates
from gpuops.sim.fleet.config import HarmLimits
from gpuops.sim.fleet.errors import FleetError
from gpuops.sim.fleet.fleetfile import FleetFileError, load_fleet, with_listeners
from gpuops.sim.fleet.remotewrite import RemoteWriteError
from gpuops.sim.reliability import FaultPlan
from gpuops.sim.whatif import SCRAPE_INTERVAL_S, Whatif, WhatifError
from gpuops.sim.whatif import whatif as run_whatif
from gpuops.sim.whatif.harm import flags
from gpuops.sim.whatif.report import table, to_json
from gpuops.sim.whatif.spread import table as spread_table
from gpuops.sim.whatif.spread import to_json_spread as spread_json

log = logging.getLogger(__name__)

HARM_EXIT = 3
"""Exit status of ``--fail-on-harm`` when a policy passed a harm limit (1: an error, 2: a
usage error)."""


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
    "--seeds",
    default=None,
    help="Run several seeds and report each figure as its median and range: a count N (the "
    "seed of --seed or of the file and the N-1 after it) or a comma-separated list of seeds "
    "(e.g. 5,11,42).",
)
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
@click.option(
    "--harm-limit",
    "harm_limit",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one of the fleet file's harm_limits (repeat for several): jct_increase "
    "(a share, 0.10: a class's mean completion 10 % longer), over_objective (a share of "
    "sessions' time over their objective), non_preemptible_stops (jobs) or "
    "completed_decrease (a share of a class's completed jobs).",
)
@click.option(
    "--fail-on-harm",
    is_flag=True,
    help=f"Exit with status {HARM_EXIT} after the report when a policy passed a harm limit "
    "(on any seed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option(
    "--plots",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Write utilization.png, queue.png and power.png (off vs on) into this directory.",
)
@BATCH_FILE
@BATCH_AT
@click.option(
    "--faults",
    "fault_scale",
    default=None,
    type=click.FloatRange(min=0, min_open=True, max=100_000),
    metavar="SCALE",
    help="Inject GPU faults into both runs at a published rate times SCALE (at the Llama 3 "
    "rate a 128-GPU fleet sees about 0.1 fault in 3 days; 300 gives about 30), with "
    "application XID floods; the on run pushes them to the engine, which quarantines and "
    "repairs through the fleet. Adds a reliability section to the report.",
)
@click.option(
    "--fault-rate",
    "fault_base",
    default="llama3",
    show_default=True,
    type=click.Choice(sorted(RATE_BASES)),
    help="The published rate --faults scales: llama3 (419 interruptions in 54 days on "
    "16,384 H100s) or rsc (Meta RSC: one failure per 8-GPU node every 47 days).",
)
@click.option(
    "--floods",
    "floods_per_day",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="With --faults: crashed jobs a day whose application XID (45) reaches every node "
    "running jobs.",
)
@click.option(
    "--human-response",
    "response",
    default="4h",
    show_default=True,
    help="With --faults: how long a person on call takes to act on a faulty node still in "
    "service or a node the remediation ladder handed over, in both runs, a duration (30m, 4h).",
)
def whatif(
    fleet_file: Path,
    rules: tuple[Path, ...],
    hours: float,
    seed: int | None,
    seeds: str | None,
    scrape_interval: float,
    prometheus_url: str | None,
    workdir: Path | None,
    all_series: bool,
    harm_limit: tuple[str, ...],
    fail_on_harm: bool,
    as_json: bool,
    plots: Path | None,
    batch_file: Path | None,
    batch_at: float,
    fault_scale: float | None,
    fault_base: str,
    floods_per_day: float,
    response: str,
) -> None:
    """Run a fleet file's workload twice in virtual time — without policies, and with the
    engine evaluating RULES against a real Prometheus and acting on the fleet — and compare
    utilization, allocation, job completion and queue wait, preemptions, reclaims, energy and
    its cost, overall, per priority class and per project."""
    try:
        config = load_fleet(fleet_file)
    except FleetFileError as exc:
        raise click.ClickException(str(exc)) from None
    config = replace(config, harm_limits=harm_limits(config.harm_limits, harm_limit))
    rollout = rollout_of(batch_file, batch_at, config, hours)
    faults = _fault_plan(fault_scale, fault_base, floods_per_day, response)
    chosen = seed_list(seeds, config.seed if seed is None else seed, seed is not None)
    if prometheus_url is not None and len(chosen) > 1:
        raise click.BadParameter(
            "several seeds need a fresh Prometheus each (leave --prometheus-url out)",
            param_hint="--prometheus-url",
        )
    runs: list[Whatif] = []
    for n in chosen:
        tag = f"seed {n}: " if len(chosen) > 1 else ""

        def progress(run: str, t: float, tag: str = tag) -> None:
            log.info("%spolicies %s: %.0f of %g virtual hours", tag, run, t / 3600.0, hours)

        try:
            result = run_whatif(
                with_listeners(config, seed=n),
                list(rules),
                hours,
                prometheus_url=prometheus_url,
                workdir=_per_seed(workdir, n, len(chosen)),
                scrape_interval_s=scrape_interval,
                progress=progress,
                all_series=all_series,
                rollout=rollout,
                faults=faults,
            )
        except RulesError as exc:
            raise click.ClickException(f"rules not loaded: {exc}") from None
        except FleetError as exc:
            raise click.ClickException(f"the fleet cannot start: {exc.message}") from None
        except (WhatifError, RemoteWriteError) as exc:
            raise click.ClickException(str(exc)) from None
        runs.append(result)
        plot_dir = _per_seed(plots, n, len(chosen))
        if plot_dir is not None:
            from gpuops.sim.whatif.plots import plot  # matplotlib: imported only for --plots

            for path in plot(result, plot_dir):
                log.info("plot: %s", path)
    if len(runs) == 1:
        click.echo(json.dumps(to_json(runs[0]), indent=2) if as_json else table(runs[0]))
    else:
        click.echo(json.dumps(spread_json(runs), indent=2) if as_json else spread_table(runs))
    if fail_on_harm and any(flags(w) for w in runs):
        raise SystemExit(HARM_EXIT)


def _fault_plan(
    scale: float | None, base: str, floods_per_day: float, response: str
) -> FaultPlan | None:
    if scale is None:
        return None
    try:
        response_s = parse_duration(response)
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (e.g. 30m, 4h)", param_hint="--human-response") from None
    if response_s < 0:
        raise click.BadParameter(f"{response!r} is negative", param_hint="--human-response")
    return FaultPlan(FaultRates(scale, base), floods_per_day, response_s)


SHARES = ("over_objective", "completed_decrease")
"""Harm limits that are a share of a whole (0 to 1)."""


def harm_limits(base: HarmLimits, pairs: tuple[str, ...]) -> HarmLimits:
    """``base`` with the ``--harm-limit KEY=VALUE`` overrides, each checked as the fleet
    file's ``harm_limits`` is."""
    kinds = {f.name: f.type for f in fields(HarmLimits)}
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in kinds:
            raise click.BadParameter(
                f"{pair!r}: expected KEY=VALUE with KEY one of {', '.join(kinds)}",
                param_hint="--harm-limit",
            )
        whole = kinds[key] in (int, "int")
        try:
            value: float | int = int(text) if whole else float(text)
        except ValueError:
            raise click.BadParameter(
                f"{pair!r}: {key} must be {'a whole number' if whole else 'a number'}",
                param_hint="--harm-limit",
            ) from None
        high = 1.0 if key in SHARES else (None if whole else 100.0)
        if value < 0 or (high is not None and value > high) or value != value:
            bounds = f"within [0, {high:g}]" if high is not None else ">= 0"
            raise click.BadParameter(f"{pair!r}: {key} must be {bounds}", param_hint="--harm-limit")
        changes[key] = value
    return replace(base, **changes)


def _per_seed(folder: Path | None, seed: int, seeds: int) -> Path | None:
    """``--workdir`` or ``--plots`` of one seed: the folder itself, or ``seed-N`` in it."""
    return folder if folder is None or seeds == 1 else folder / f"seed-{seed}"


def seed_list(text: str | None, first: int, seed_given: bool) -> list[int]:
    """The seeds of ``--seeds``: a count from ``first``, or a list; one seed without it."""
    if text is None:
        return [first]
    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a count nor a comma-separated list of seeds", param_hint="--seeds"
        ) from None
    if len(numbers) == 1:
        if not 1 <= numbers[0] <= 100:
            raise click.BadParameter(
                f"a count of seeds must be within [1, 100], got {numbers[0]}", param_hint="--seeds"
            )
        return [first + i for i in range(numbers[0])]
    if seed_given:
        raise click.BadParameter("a list of seeds and --seed together", param_hint="--seeds")
    if len(set(numbers)) != len(numbers):
        raise click.BadParameter(f"seed repeated in {text!r}", param_hint="--seeds")
    return numbers
