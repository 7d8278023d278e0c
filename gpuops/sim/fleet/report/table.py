"""A fleet run's figures as aligned text (``gpuops fleet run``), and the rows of where its
idle GPU-hours went, which the what-if's table shows too.

Used by ``gpuops.cli.fleet`` and ``gpuops.sim.whatif.report``. Pure: it reads ``RunReport``.
"""

from __future__ import annotations

from gpuops.sim.fleet.report.figures import RunReport, WasteFigures


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value / 3600:.2f} h"


def table(r: RunReport) -> str:
    """The report as aligned text."""
    lines = [
        f"fleet {r.fleet}: {r.hours:.1f} virtual hours, {r.gpus_mean:.0f} GPUs on average",
        f"  utilization over powered GPUs    {_pct(r.utilization_powered)}",
        f"    weighted by GPU throughput     {_pct(r.utilization_weighted)}",
        f"    without work done again        {_pct(r.utilization_powered_net)}",
        f"    at most, jobs in their pools   {_pct(r.utilization_bound_pools)}",
        f"    at most, jobs in any pool      {_pct(r.utilization_bound_any_pool)}",
        f"  utilization over allocated GPUs  {_pct(r.utilization_allocated)}",
        f"  allocation ratio                 {_pct(r.allocation_ratio)}",
        f"  jobs completed / queued at end   {r.jobs_completed} / {r.jobs_queued_at_end} "
        f"(and {r.culled} notebook sessions culled)",
        f"  JCT mean, culled sessions whole  {_hours(r.jct_mean_s)} "
        f"(completed jobs only: {_hours(r.jct_completed_mean_s)})",
        f"  preemptions / reclaims           {r.preemptions} / {r.reclaims} "
        f"({r.reclaimed_gpu_hours:.1f} GPU-h reclaimed, {r.culled} notebooks culled)",
        f"  energy                           {r.energy_kwh:.1f} kWh, "
        f"{r.energy_cost:.2f} {r.currency}",
        f"  total cost (energy and rental)   {r.total_cost:.2f} {r.currency} "
        f"(rental {r.rental_cost:.2f})",
        f"  work (full-clock GPU-hours)      {r.work_gpu_hours:.1f}",
        "  kWh per GPU-hour of work         "
        + ("-" if r.kwh_per_work_gpu_hour is None else f"{r.kwh_per_work_gpu_hour:.3f}"),
        f"  completed jobs' GPU-hours        {r.completed_gpu_hours:.1f}",
        "  kWh per completed GPU-hour       "
        + ("-" if r.kwh_per_completed_gpu_hour is None else f"{r.kwh_per_completed_gpu_hour:.3f}"),
        f"  throughput lost to clock locks   {_pct(r.downclock_loss)}",
        f"  throughput lost to GPU sharing   {_pct(r.sharing_loss)}",
        f"  packs / work redone on restarts  {r.packs} / {r.restart_gpu_hours:.1f} GPU-h",
        f"  nodes consolidated / jobs moved  {r.consolidations} / {r.jobs_moved}",
        f"  JCT mean, unfinished counted     {_hours(r.jct_all_mean_s)} "
        f"({r.jobs_submitted} jobs submitted)",
        "",
        f"  {'priority class':<16}{'done':>6}{'JCT mean':>11}{'JCT p95':>11}"
        f"{'wait mean':>11}{'wait p95':>11}",
    ]
    for pc, c in r.classes.items():
        lines.append(
            f"  {pc:<16}{c.completed:>6}{_hours(c.jct_mean_s):>11}{_hours(c.jct_p95_s):>11}"
            f"{_hours(c.wait_mean_s):>11}{_hours(c.wait_p95_s):>11}"
        )
    lines += [
        "",
        f"  {'project':<16}{'util(alloc)':>12}{'GPU-h':>9}{'done':>6}{'preempt':>9}"
        f"{'credit GPU-h':>14}",
    ]
    for p, f in r.projects.items():
        lines.append(
            f"  {p:<16}{_pct(f.utilization_allocated):>12}{f.allocated_gpu_hours:>9.1f}"
            f"{f.completed:>6}{f.preemptions:>9}{f.credit_gpu_hours:>14.2f}"
        )
    lines += [
        "",
        f"  {'pool':<16}{'powered GPU-h':>14}{'util':>8}{'at most':>9}{'alloc GPU-h':>13}"
        f"{'util':>8}",
    ]
    for name, pf in r.pools.items():
        lines.append(
            f"  {name:<16}{pf.powered_gpu_hours:>14.1f}{_pct(pf.utilization_powered):>8}"
            f"{_pct(pf.utilization_bound):>9}{pf.allocated_gpu_hours:>13.1f}"
            f"{_pct(pf.utilization_allocated):>8}"
        )
    lines += ["", f"  energy by draw (kWh): {sum(r.energy_split_kwh.values()):.1f}"]
    lines += [f"    {label:<34}{value:>8.1f}" for label, value in r.energy_split_kwh.items()]
    powered = sum(pf.powered_gpu_hours for pf in r.pools.values())
    lines += ["", f"  powered GPU-hours not busy: {r.waste.total():.1f} of {powered:.1f}"]
    lines += [f"    {label:<34}{value:>8.1f}" for label, value in waste_rows(r.waste)]
    return "\n".join(lines)


def waste_rows(w: WasteFigures) -> list[tuple[str, float]]:
    """``WasteFigures`` as (label, GPU-hours) rows, for the tables."""
    rows = [(f"unallocated, pool {k}", v) for k, v in w.unallocated.items()]
    rows += [(f"held whole, unused: {k}", v) for k, v in w.idle_whole.items()]
    rows += [(f"shared, unused: {k}", v) for k, v in w.idle_shared.items()]
    rows += [(f"shared unused, limit: {k}", v) for k, v in w.shared_limit.items()]
    rows += [(f"unallocated, node {k}", v) for k, v in w.unallocated_node.items()]
    return rows
