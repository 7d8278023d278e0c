"""`gpuops whatif` at full size: the case-study fleet scaled to ~500 GPUs
(every pool, reservation and arrival rate x11), 24 virtual hours, policies off and on (the
case study's rules), with a real Prometheus fed by remote write. Prints the wall time of each
run against the target (<= 10 minutes for both on these 2-core machines) and the comparison
table; then the case-study fleet itself at its own size (the README's table). Never fails on
noise.

Run: ``python -m tests.benchmarks.bench_whatif [hours] [factor] [scrape interval s]``
(``make bench`` runs it with 24 hours, x11 and the unscaled case study).
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpuops.sim.fleet.config import FleetConfig, ProjectSpec
from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sim.whatif import PARTS, SCRAPE_INTERVAL_S, RunResult, whatif
from gpuops.sim.whatif.report import table

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "examples" / "fleets" / "case-study.yaml"
RULES = [
    REPO / "rules" / "gpu-efficiency.yaml",
    REPO / "rules" / "energy",
    REPO / "rules" / "fleet",
]
TARGET_S = 600.0


def scaled(config: FleetConfig, factor: int) -> FleetConfig:
    """``config`` with ``factor`` times the nodes (and machines), reservations and arrivals."""
    pools = tuple(
        replace(
            p,
            nodes=p.nodes * factor,
            max_nodes=None if p.max_nodes is None else p.max_nodes * factor,
        )
        for p in config.pools
    )
    projects = tuple(
        ProjectSpec(p.name, tuple((pool, n * factor) for pool, n in p.reserved))
        for p in config.reservations
    )
    classes = tuple(
        replace(
            c,
            rate_per_hour=c.rate_per_hour * factor,
            bursts=tuple(replace(b, jobs=b.jobs * factor) for b in c.bursts),
        )
        for c in config.job_classes
    )
    return replace(
        config,
        name=f"{config.name} x{factor}",
        pools=pools,
        reservations=projects,
        job_classes=classes,
    )


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def parts(run: RunResult) -> str:
    """Wall and CPU per part of one run (``gpuops.sim.whatif.PARTS``)."""
    rows = [f"  {'part':<18} {'wall s':>8} {'CPU s':>8}  what"]
    for name, what in PARTS:
        if name in run.parts:
            wall, cpu = run.parts[name]
            rows.append(f"  {name:<18} {_seconds(wall):>8} {_seconds(cpu):>8}  {what}")
    return "\n".join(rows)


def one(config: FleetConfig, hours: float, scrape_interval_s: float = SCRAPE_INTERVAL_S) -> float:
    gpus = sum(p.nodes * p.gpus_per_node for p in config.pools)
    load = os.getloadavg()
    started = time.perf_counter()
    cpu, children = time.process_time(), _children_cpu_s()
    result = whatif(config, RULES, hours, scrape_interval_s=scrape_interval_s)
    wall = time.perf_counter() - started
    cpu, children = time.process_time() - cpu, _children_cpu_s() - children
    print(
        f"fleet {config.name}: {gpus} GPUs, {hours:g} virtual hours, policies off and on, "
        f"scrape interval {scrape_interval_s:g} s"
    )
    print(
        f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)"
    )
    day = wall * 24.0 / hours
    print(
        f"wall: {wall:.0f} s in all (off {result.off.wall_s:.0f} s, on {result.on.wall_s:.0f} s, "
        f"the rest Prometheus' start and stop)"
        + ("" if hours == 24.0 else f"; 24 virtual hours projected: {day:.0f} s")
        + f"; target for 24 h: {TARGET_S:.0f} s, "
        + ("met" if day <= TARGET_S else "NOT met")
    )
    print(
        f"CPU: {cpu + children:.0f} s in all: this process {cpu:.0f} s, its children "
        f"(Prometheus, the off run's process) {children:.0f} s"
    )
    for label, run in (("off", result.off), ("on", result.on)):
        print(f"{label}: wall {run.wall_s:.1f} s, CPU {run.parts['all'][1]:.1f} s")
        if run.queries[0]:
            asked, answered = run.queries
            print(f"  engine queries: {asked:,} asked, {answered:,} answered at the same instant")
        if run.series[0]:
            series, samples = run.series
            print(f"  written to Prometheus: {series:,} series, {samples:,} samples")
        print(parts(run))
    print(table(result), flush=True)
    return wall


def _children_cpu_s() -> float:
    """User and system CPU seconds of the child processes waited for so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main(hours: float, factor: int, scrape_interval_s: float) -> None:
    config = load_fleet(FLEET)
    one(scaled(config, factor), hours, scrape_interval_s)
    print()
    one(config, hours, scrape_interval_s)


if __name__ == "__main__":
    main(
        float(sys.argv[1]) if len(sys.argv) > 1 else 24.0,
        int(sys.argv[2]) if len(sys.argv) > 2 else 11,
        float(sys.argv[3]) if len(sys.argv) > 3 else SCRAPE_INTERVAL_S,
    )
