"""What a fleet run achieved: the figures ``gpuops whatif`` compares (off vs on), measured on
the cluster itself at every virtual scrape — utilization over powered and over allocated GPUs,
allocation ratio, per project; job completion time and queue wait per priority class;
preemptions; reclaims; energy, its cost, and energy per GPU-hour of work.

``Recorder`` (``recorder``) observes the cluster and makes a ``RunReport`` (``figures``); the
bounds on utilization are ``bounds``; ``table`` writes a report as text. Used by
``gpuops fleet run`` (``gpuops.cli.fleet``) and the what-if (``gpuops.sim.whatif``).
"""

from gpuops.sim.fleet.report.figures import (
    ClassFigures,
    Point,
    PoolFigures,
    ProjectFigures,
    RunReport,
    WasteFigures,
)
from gpuops.sim.fleet.report.recorder import Recorder, p95
from gpuops.sim.fleet.report.table import table, waste_rows

__all__ = [
    "ClassFigures",
    "Point",
    "PoolFigures",
    "ProjectFigures",
    "Recorder",
    "RunReport",
    "WasteFigures",
    "p95",
    "table",
    "waste_rows",
]
