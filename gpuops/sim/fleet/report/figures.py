"""The figures of one fleet run: ``RunReport`` (JSON-ready) and its parts per priority class,
project and pool, where the idle GPU-hours went (``WasteFigures``), and the fleet at each
observation (``Point``).

Made by ``gpuops.sim.fleet.report.recorder`` at the end of a run; read by the tables
(``gpuops.sim.fleet.report.table``, ``gpuops.sim.whatif.report``) and the what-if's plots.
Values only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Point:
    """The fleet at one scrape: what the what-if's plots draw (off vs on)."""

    t_s: float
    powered: int
    """GPUs that exist and are up."""
    allocated: int
    busy: float
    """Sum of their utilization (0-1 each)."""
    queued: int
    """Jobs waiting."""
    power_watts: float
    """What the powered nodes draw: GPUs and hosts."""

    @property
    def utilization(self) -> float | None:
        return self.busy / self.powered if self.powered else None


@dataclass(frozen=True)
class ClassFigures:
    completed: int
    """Finished jobs (not culled sessions)."""
    jct_mean_s: float | None
    """Over finished jobs and culled sessions (``RunReport.jct_mean_s``), as the wait."""
    jct_p95_s: float | None
    wait_mean_s: float | None
    wait_p95_s: float | None
    culled: int = 0
    """Notebook sessions ``Cluster.cull`` ended."""
    slowdown_p95: float | None = None
    """Sessions (notebook, inference; finished, culled or still running): the 95th percentile
    of their mean slowdown (how many times slower they answered than on a GPU of their own at
    full clock: sharing and clock locks). None: the class has no session."""
    over_objective: float | None = None
    """Share of its sessions' time answered slower than their class's ``slowdown_objective``
    (None: no objective, or no session)."""
    preemptions: int = 0
    """Its jobs stopped by the scheduler for others (the owner taking back what they
    borrowed, a class that ``preempts``, a grant's end) and requeued."""
    restarts: int = 0
    """Its jobs the policies' verbs stopped to start again (``Cluster.restart_cost``):
    reclaimed and requeued, packed elsewhere, moved by consolidation; culls and preemptions
    are not among them."""


@dataclass(frozen=True)
class ProjectFigures:
    utilization_allocated: float | None
    allocated_gpu_hours: float
    completed: int
    preemptions: int
    credit_gpu_hours: float
    jct_mean_s: float | None = None
    wait_mean_s: float | None = None


@dataclass(frozen=True)
class PoolFigures:
    """Where the powered GPU-hours went, per pool: what bounds utilization over powered GPUs."""

    powered_gpu_hours: float
    utilization_powered: float | None
    allocated_gpu_hours: float
    utilization_allocated: float | None
    utilization_bound: float | None = None
    """The most utilization over powered GPUs its jobs allowed (``RunReport.
    utilization_bound_pools``, for this pool)."""


@dataclass(frozen=True)
class WasteFigures:
    """Where the powered GPU-hours that do no work go (the part of them not busy): what bounds
    utilization over powered GPUs, and which policy could take it back.

    - ``unallocated``: per pool, powered GPUs (up or booting) that no job holds, at 0 %.
    - ``idle_whole``: per job class, the unused part (1 - utilization) of GPUs its jobs hold
      whole: a notebook held idle, a light job on a whole GPU, a job relaunching.
    - ``idle_shared``: per job class, its part of the unused capacity of shared GPUs (a shared
      GPU's unused part divided among its jobs).
    - ``shared_limit``: the unused capacity of shared GPUs by what kept one more job off:
      ``slices`` (every slice taken), ``memory`` (less free memory than the smallest job on
      it needs), ``room`` (a slice and the memory were free: no shareable job took them).
    - ``unallocated_node``: ``unallocated`` again, by the state of the GPU's node: ``booting``
      (powered up, not running jobs yet), ``empty`` (up, no job on any of its GPUs: waiting
      for a power-down or for work), ``partly used`` (up, other GPUs of it held): which of
      boots, power-down waits and nodes that never empty keeps free GPUs powered.
    """

    unallocated: dict[str, float] = field(default_factory=dict)
    idle_whole: dict[str, float] = field(default_factory=dict)
    idle_shared: dict[str, float] = field(default_factory=dict)
    shared_limit: dict[str, float] = field(default_factory=dict)
    unallocated_node: dict[str, float] = field(default_factory=dict)
    class_allocated: dict[str, float] = field(default_factory=dict)
    """Per job class, GPU-hours its jobs held (a shared GPU's hours divided among its jobs)."""
    class_busy: dict[str, float] = field(default_factory=dict)
    """Per job class, the busy part of those GPU-hours."""

    def total(self) -> float:
        return (
            sum(self.unallocated.values())
            + sum(self.idle_whole.values())
            + sum(self.idle_shared.values())
        )


@dataclass(frozen=True)
class RunReport:
    fleet: str
    hours: float
    gpus_mean: float
    utilization_powered: float | None
    """Mean utilization over the GPUs that are up (allocated or not)."""
    utilization_allocated: float | None
    """Mean utilization over the GPUs a job holds."""
    allocation_ratio: float | None
    jobs_completed: int
    """Jobs that finished; notebook sessions a reclaim culled are not among them (``culled``)."""
    jobs_queued_at_end: int
    jct_mean_s: float | None
    """Job completion time (submit to finish) over every finished job and every culled
    session, a culled session at the time its whole session would have taken (its wait plus
    its duration, as without policies): leaving culled sessions out would drop long sessions
    from the on run's mean only and flatter it (``jct_completed_mean_s``). The what-if's target
    reads this one. The p95 and the queue wait are over the same jobs."""
    jct_p95_s: float | None
    wait_mean_s: float | None
    preemptions: int
    reclaims: int
    reclaimed_gpu_hours: float
    """GPU-hours the reclaimed jobs would still have held."""
    energy_kwh: float
    energy_cost: float
    currency: str
    work_gpu_hours: float
    """Job progress at full-clock speed (throughput)."""
    kwh_per_work_gpu_hour: float | None
    completed_gpu_hours: float = 0.0
    """GPU-hours (at full clock) the completed jobs asked for: the work delivered."""
    kwh_per_completed_gpu_hour: float | None = None
    downclock_loss: float = 0.0
    """Share of full-clock progress lost to clock locks: lost / (done + lost)."""
    sharing_loss: float = 0.0
    """Share of progress lost to sharing GPUs (contention, context switches), the same way."""
    restart_gpu_hours: float = 0.0
    """What restarts cost jobs stopped and started again (reclaimed, packed elsewhere,
    consolidated): the relaunch (GPUs held, idle) and the work done again, in GPU-hours."""
    utilization_powered_net: float | None = None
    """``utilization_powered`` without the load of work done again after restarts: busy,
    but not useful."""
    packs: int = 0
    jct_all_mean_s: float | None = None
    """Completion time over every job submitted, those unfinished at the end counted until
    then (a lower bound): not flattered by long jobs that did not finish."""
    jobs_submitted: int = 0
    consolidations: int = 0
    """Nodes emptied and powered down by ``consolidate``."""
    jobs_moved: int = 0
    """Jobs it moved to other nodes (each paying its restart)."""
    culled: int = 0
    """Notebook sessions a reclaim culled (``Cluster.cull``; among ``reclaims``)."""
    jct_completed_mean_s: float | None = None
    """Job completion time over finished jobs only, culled sessions left out."""
    classes: dict[str, ClassFigures] = field(default_factory=dict)
    projects: dict[str, ProjectFigures] = field(default_factory=dict)
    pools: dict[str, PoolFigures] = field(default_factory=dict)
    waste: WasteFigures = field(default_factory=WasteFigures)
    """Where the powered GPU-hours not busy went (``WasteFigures``)."""
    rental_cost: float = 0.0
    """Powered GPU-hours of pools with a ``price_per_gpu_hour`` at that price (a cloud pool's
    rented instances), in the tariff's currency."""
    total_cost: float = 0.0
    """``energy_cost`` plus ``rental_cost``."""
    utilization_weighted: float | None = None
    """Utilization over powered GPUs with each GPU-hour weighted by its model's throughput
    (``GpuModel.fp16_tflops``): a busy T4-hour counts a fifth of a busy A100-hour, a busy
    H100-hour three times one."""
    utilization_bound_pools: float | None = None
    """The most utilization over powered GPUs this run's jobs allowed where they ran, each at
    the load it ran at: at every instant, each pool powering only the whole nodes its running
    jobs need, shareable jobs packed as densely as memory, slices and their load allow without
    asking a GPU for more than it has (``gpuops.sim.fleet.report.bounds``). For these jobs at
    these loads, above it only moving jobs to other pools helps, not powering down or packing
    within a pool; a different schedule (other jobs running) has its own figure."""
    utilization_bound_any_pool: float | None = None
    """The same with every shareable job free to run in any pool it may use, quotas ignored,
    and no node rounding: a relaxation (``gpuops.sim.fleet.report.bounds``)."""
    energy_split_kwh: dict[str, float] = field(default_factory=dict)
    """Where the nodes' energy went, from their power at each observation: ``free GPUs (idle
    draw)`` (powered, no job: booting, waiting for a power-down or for work), ``held GPUs,
    idle draw`` (the idle power of GPUs jobs hold: what any held GPU draws), ``held GPUs,
    load`` (the power above idle that their load draws, after clock locks), ``hosts, idle
    draw`` (every powered node's host at no load: CPUs, memory, NICs, fans, PSU losses) and
    ``hosts, load`` (the host's draw above idle, growing with its GPUs' load). Sums to about
    ``energy_kwh`` (observed every 30 s; the meter integrates every cluster step)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
