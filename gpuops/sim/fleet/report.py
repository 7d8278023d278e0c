"""What a fleet run achieved: the figures ``gpuops whatif`` compares (off vs on), measured on
the cluster itself at every virtual scrape — utilization over powered and over allocated GPUs,
allocation ratio, per project; job completion time and queue wait per priority class;
preemptions; reclaims; energy, its cost, and energy per GPU-hour of work.

``Recorder.observe`` is called by ``gpuops.sim.fleet.virtual`` at each scrape; ``Recorder.report``
turns the sums into a ``RunReport`` (JSON-ready, and a text table via ``table``). Used by
``gpuops fleet run`` (``gpuops.cli.fleet``).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import GPU_MODELS
from gpuops.sim.fleet.energy import JOULES_PER_KWH
from gpuops.sim.fleet.model import Gpu, Job


@dataclass
class _Sums:
    powered_s: float = 0.0
    """GPU-seconds of GPUs that exist and are up."""
    busy_s: float = 0.0
    """Utilization x seconds over those."""
    allocated_s: float = 0.0
    allocated_busy_s: float = 0.0
    pools_s: float = 0.0
    """GPU-seconds the running jobs needed at least in their pools, whole nodes
    (``_Fewest``)."""
    any_pool_s: float = 0.0
    """GPU-seconds they needed at least in any pool they may use (``_Fewest``)."""

    def add(self, rates: _Sums, dt: float) -> None:
        """Add ``rates`` (GPUs and utilization sums at one instant) held for ``dt`` seconds."""
        self.powered_s += rates.powered_s * dt
        self.busy_s += rates.busy_s * dt
        self.allocated_s += rates.allocated_s * dt
        self.allocated_busy_s += rates.allocated_busy_s * dt
        self.pools_s += rates.pools_s * dt
        self.any_pool_s += rates.any_pool_s * dt


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
    from the on run's mean only and flatter it (``jct_completed_mean_s``). The issue's target
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
    utilization_bound_pools: float | None = None
    """The most utilization over powered GPUs this run's jobs allowed where they ran, each at
    the load it ran at: at every instant, each pool powering only the whole nodes its running
    jobs need, shareable jobs packed as densely as memory, slices and their load allow without
    asking a GPU for more than it has (``_Fewest``). For these jobs at these loads, above
    it only moving jobs to other pools helps, not powering down or packing within a pool; a
    different schedule (other jobs running) has its own figure."""
    utilization_bound_any_pool: float | None = None
    """The same with every shareable job free to run in any pool it may use, quotas ignored,
    and no node rounding: a relaxation (``_Fewest``)."""
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


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Recorder:
    """Sums of the fleet's state over virtual time, observed at each scrape."""

    def __init__(self) -> None:
        self.total = _Sums()
        self.projects: dict[str, _Sums] = defaultdict(_Sums)
        self.pools: dict[str, _Sums] = defaultdict(_Sums)
        self.seconds = 0.0
        self._last: float | None = None
        self._rate = _Sums()
        """GPUs (powered, allocated) and their utilization sums at the last observation."""
        self._project_rates: dict[str, _Sums] = {}
        self._pool_rates: dict[str, _Sums] = {}
        self.points: list[Point] = []
        """The fleet at every observation (``Point``)."""
        self.waste: dict[tuple[str, str], float] = defaultdict(float)
        """(kind, key) -> GPU-seconds (``WasteFigures``: kind is one of its fields)."""
        self._waste_rates: dict[tuple[str, str], float] = {}

    def observe(self, cluster: Cluster) -> None:
        """Count the interval since the previous observation at the state seen then (a job
        that finished within it counts until the instant it was last seen running)."""
        now = cluster.time
        if self._last is not None and now > self._last:
            dt = now - self._last
            self.seconds += dt
            self.total.add(self._rate, dt)
            for project, rates in self._project_rates.items():
                self.projects[project].add(rates, dt)
            for pool, rates in self._pool_rates.items():
                self.pools[pool].add(rates, dt)
            for key, value in self._waste_rates.items():
                self.waste[key] += value * dt
        self._last = now
        rate = _Sums()
        projects: dict[str, _Sums] = defaultdict(_Sums)
        pools: dict[str, _Sums] = defaultdict(_Sums)
        power = 0.0
        waste: dict[tuple[str, str], float] = defaultdict(float)
        fewest = _Fewest(cluster)
        with cluster.lock:
            queued = sum(len(q) for q in cluster.queues.values())
            for node in cluster.nodes.values():
                if node.failed:
                    continue
                in_pool = pools[node.pool]
                node_state = (
                    "booting"
                    if node.booting_until is not None
                    else ("empty" if node.idle() else "partly used")
                )
                power += node.host_power
                host_idle_w = min(node.host_idle_power, node.host_power)
                waste[("energy", "hosts, idle draw")] += host_idle_w
                waste[("energy", "hosts, load")] += node.host_power - host_idle_w
                for gpu in node.gpus:
                    rate.powered_s += 1
                    rate.busy_s += gpu.utilization
                    in_pool.powered_s += 1
                    in_pool.busy_s += gpu.utilization
                    power += gpu.power
                    holders = [gpu.job] if gpu.job is not None else gpu.tenants
                    idle_w = min(gpu.model.idle_power_watts, gpu.power)
                    if not holders:
                        waste[("energy", "free GPUs (idle draw)")] += gpu.power
                        waste[("unallocated", node.pool)] += 1.0 - gpu.utilization
                        waste[("unallocated_node", node_state)] += 1.0 - gpu.utilization
                        continue
                    waste[("energy", "held GPUs, idle draw")] += idle_w
                    waste[("energy", "held GPUs, load")] += gpu.power - idle_w
                    rate.allocated_s += 1
                    rate.allocated_busy_s += gpu.utilization
                    in_pool.allocated_s += 1
                    in_pool.allocated_busy_s += gpu.utilization
                    share = 1.0 / len(holders)  # a shared GPU: each job's part of it
                    unused = 1.0 - gpu.utilization
                    kind = "idle_whole" if gpu.job is not None else "idle_shared"
                    for holder in holders:
                        job = cluster.jobs[holder]
                        fewest.hold(node.pool, gpu, job, len(holders))
                        mine = projects[job.project]
                        mine.allocated_s += share
                        mine.allocated_busy_s += gpu.utilization * share
                        waste[("class_allocated", job.job_class or "-")] += share
                        waste[("class_busy", job.job_class or "-")] += gpu.utilization * share
                        waste[(kind, job.job_class or "-")] += unused * share
                    if gpu.tenants:
                        waste[("shared_limit", _shared_limit(cluster, node.pool, gpu))] += unused
            in_pools, rate.any_pool_s = fewest.gpus()
            for pool, gpus in in_pools.items():
                pools[pool].pools_s = gpus
                rate.pools_s += gpus
        self._rate = rate
        self._project_rates = dict(projects)
        self._pool_rates = dict(pools)
        self._waste_rates = dict(waste)
        self.points.append(
            Point(now, int(rate.powered_s), int(rate.allocated_s), rate.busy_s, queued, power)
        )

    def report(self, cluster: Cluster) -> RunReport:
        with cluster.lock:
            finished = list(cluster.completed)
            culled_rows = list(cluster.culled_sessions)
            queued = sum(len(q) for q in cluster.queues.values())
            preemptions = dict(cluster.scheduler.preemptions)
            credit = dict(cluster.scheduler.credit_gpu_s)
            energy_kwh = sum(cluster.energy_joules.values()) / JOULES_PER_KWH
            work_h = cluster.work_gpu_s / 3600.0
            lost_h = cluster.downclock_lost_gpu_s / 3600.0
            share_h = cluster.share_lost_gpu_s / 3600.0
            restart_h = cluster.restart_lost_gpu_s / 3600.0
            redo_busy_s = cluster.redo_busy_gpu_s
            packs = cluster.counters["packed"]
            consolidations = cluster.counters["consolidated"]
            moved = cluster.counters["moved"]
            culled = cluster.counters.get("culled", 0)
            unfinished = [cluster.time - j.submitted_at for j in cluster.jobs.values()]
            completed_h = cluster.completed_gpu_s / 3600.0
            reclaims = cluster.counters["reclaimed"]
            reclaimed_h = cluster.reclaimed_gpu_s / 3600.0
            cost = cluster.energy_cost
            currency = cluster.config.tariff.currency
            name = cluster.config.name
        done = finished + culled_rows  # the completion times count culled sessions whole
        by_class: dict[str, list[tuple[float, float]]] = defaultdict(list)
        by_project: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for pc, project, wait, jct in done:
            by_class[pc or "-"].append((wait, jct))
            by_project[project].append((wait, jct))
        culled_in: Counter[str] = Counter(pc or "-" for pc, *_ in culled_rows)
        culled_of: Counter[str] = Counter(project for _, project, *_ in culled_rows)
        classes = {
            pc: ClassFigures(
                completed=len(rows) - culled_in[pc],
                jct_mean_s=_mean([j for _, j in rows]),
                jct_p95_s=_p95([j for _, j in rows]),
                wait_mean_s=_mean([w for w, _ in rows]),
                wait_p95_s=_p95([w for w, _ in rows]),
                culled=culled_in[pc],
            )
            for pc, rows in sorted(by_class.items())
        }
        names = sorted(set(self.projects) | set(by_project) | set(preemptions))
        projects = {
            p: ProjectFigures(
                utilization_allocated=_ratio(
                    self.projects[p].allocated_busy_s, self.projects[p].allocated_s
                ),
                allocated_gpu_hours=self.projects[p].allocated_s / 3600.0,
                completed=len(by_project.get(p, [])) - culled_of[p],
                preemptions=preemptions.get(p, 0),
                credit_gpu_hours=credit.get(p, 0.0) / 3600.0,
                jct_mean_s=_mean([j for _, j in by_project.get(p, [])]),
                wait_mean_s=_mean([w for w, _ in by_project.get(p, [])]),
            )
            for p in names
        }
        pools = {
            name: PoolFigures(
                powered_gpu_hours=sums.powered_s / 3600.0,
                utilization_powered=_ratio(sums.busy_s, sums.powered_s),
                allocated_gpu_hours=sums.allocated_s / 3600.0,
                utilization_allocated=_ratio(sums.allocated_busy_s, sums.allocated_s),
                utilization_bound=_ratio(sums.busy_s, sums.pools_s),
            )
            for name, sums in sorted(self.pools.items())
        }
        kinds: dict[str, dict[str, float]] = defaultdict(dict)
        for (kind, key), gpu_s in sorted(self.waste.items()):
            kinds[kind][key] = gpu_s / 3600.0
        energy_split = {k: wh / 1000.0 for k, wh in kinds.pop("energy", {}).items()}
        waste = WasteFigures(**kinds)
        t = self.total
        return RunReport(
            fleet=name,
            hours=self.seconds / 3600.0,
            gpus_mean=t.powered_s / self.seconds if self.seconds else 0.0,
            utilization_powered=_ratio(t.busy_s, t.powered_s),
            utilization_allocated=_ratio(t.allocated_busy_s, t.allocated_s),
            allocation_ratio=_ratio(t.allocated_s, t.powered_s),
            utilization_bound_pools=_ratio(t.busy_s, t.pools_s),
            utilization_bound_any_pool=_ratio(t.busy_s, t.any_pool_s),
            jobs_completed=len(finished),
            jobs_queued_at_end=queued,
            jct_mean_s=_mean([jct for *_, jct in done]),
            jct_p95_s=_p95([jct for *_, jct in done]),
            wait_mean_s=_mean([wait for *_, wait, _ in done]),
            preemptions=sum(preemptions.values()),
            reclaims=reclaims,
            reclaimed_gpu_hours=reclaimed_h,
            energy_kwh=energy_kwh,
            energy_cost=cost,
            currency=currency,
            work_gpu_hours=work_h,
            kwh_per_work_gpu_hour=_ratio(energy_kwh, work_h),
            completed_gpu_hours=completed_h,
            kwh_per_completed_gpu_hour=_ratio(energy_kwh, completed_h),
            downclock_loss=_ratio(lost_h, work_h + lost_h + share_h) or 0.0,
            sharing_loss=_ratio(share_h, work_h + lost_h + share_h) or 0.0,
            restart_gpu_hours=restart_h,
            utilization_powered_net=_ratio(max(t.busy_s - redo_busy_s, 0.0), t.powered_s),
            packs=packs,
            jct_all_mean_s=_mean([jct for *_, jct in done] + unfinished),
            jobs_submitted=len(done) + len(unfinished),
            consolidations=consolidations,
            jobs_moved=moved,
            culled=culled,
            jct_completed_mean_s=_mean([jct for *_, jct in finished]),
            classes=classes,
            projects=projects,
            pools=pools,
            waste=waste,
            energy_split_kwh=energy_split,
        )


class _Fewest:
    """The fewest GPUs that could hold the jobs running at one observation, two ways
    (``Recorder.observe`` calls ``hold`` for every job on every GPU it counts, with the cluster
    lock held); utilization over them is the most that any placement and power management of
    the same jobs, each at the load it has now, could reach (``RunReport.
    utilization_bound_pools``, ``utilization_bound_any_pool``). "At the load it has now": no
    GPU asked for more than it has (time-slicing admits more, the jobs then slow down and the
    GPU reads 100 %) and no job's load changed by its place (a MIG slice caps it); a placement
    that changes loads is outside what these figures bound.

    A job that cannot share needs the GPUs it holds whole. Shareable jobs need at least what
    their memory, their slices (one each per GPU they use) and their load (a shared GPU's load
    divided among its jobs) need, each as shares of one GPU (``_Bins``).

    - *pools*: each pool holds the jobs running in it now, and powers whole nodes: the pool's
      GPUs needed, rounded up to its nodes' size (no powered node without a job, no job
      moved to another pool);
    - *any pool*: every shareable job counted against the roomiest GPU (most memory, most
      slices) of the pools it may run in, all of them together, and no node rounding: a
      relaxation.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.whole: dict[str, int] = defaultdict(int)
        self.shares: dict[str, _Bins] = defaultdict(_Bins)
        self.alone = 0
        self.anywhere = _Bins()
        self._roomiest: dict[tuple[str, ...], tuple[int, int]] = {}
        """Pools a job may run in (its own pool last) -> (most memory, most slices)."""

    def hold(self, pool: str, gpu: Gpu, job: Job, holders: int) -> None:
        """Count ``job`` on ``gpu`` of ``pool``, shared by ``holders`` jobs (1: whole)."""
        if not job.shareable:
            self.whole[pool] += 1
            self.alone += 1
            return
        c = self.cluster
        spec = c.pools[pool]
        load = gpu.utilization / holders
        used = c.job_bytes(job, gpu)
        if spec.slices > 1:  # a share over 1 (memory_gib beyond the GPU) counts as 1
            here = min(used / gpu.model.memory_bytes, 1.0)
            self.shares[pool].add(here, 1.0 / spec.slices, load)
        else:
            self.whole[pool] += 1
        may = (*(job.pools or (job.pool,)), pool)
        roomiest = self._roomiest.get(may)
        if roomiest is None:
            specs = [c.pools[p] for p in may]
            memory = max(GPU_MODELS[m.model].memory_bytes for m in specs)
            roomiest = self._roomiest[may] = (memory, max(m.slices for m in specs))
        self.anywhere.add(min(used / roomiest[0], 1.0), 1.0 / roomiest[1], load)

    def gpus(self) -> tuple[dict[str, int], int]:
        """(pool -> GPUs its jobs need, whole nodes), GPUs the jobs need in any pool."""
        in_pools = {}
        for pool in set(self.whole) | set(self.shares):
            gpus = self.whole[pool] + (self.shares[pool].fewest() if pool in self.shares else 0)
            size = self.cluster.pools[pool].gpus_per_node
            in_pools[pool] = -(-gpus // size) * size
        return in_pools, self.alone + self.anywhere.fewest()


class _Bins:
    """Shareable jobs as items of a vector bin packing (memory, slices, load; each a share of
    one GPU) and a lower bound on the GPUs that hold them: per dimension, the sum rounded up,
    or the items over half a GPU (no two of them fit one GPU), whichever is more; the most
    over the dimensions."""

    def __init__(self) -> None:
        self.sums = [0.0, 0.0, 0.0]
        self.big = [0, 0, 0]

    def add(self, *item: float) -> None:
        for d, size in enumerate(item):
            self.sums[d] += size
            self.big[d] += size > 0.5 + 1e-9

    def fewest(self) -> int:
        return max(
            max(math.ceil(total - 1e-9) if total > 0 else 0, big)
            for total, big in zip(self.sums, self.big, strict=True)
        )


def _shared_limit(cluster: Cluster, pool: str, gpu: Gpu) -> str:
    """What keeps one more job off shared ``gpu`` (``WasteFigures.shared_limit``)."""
    if len(gpu.tenants) >= cluster.pools[pool].slices:
        return "slices"
    used = [cluster.job_bytes(cluster.jobs[j], gpu) for j in gpu.tenants]
    if gpu.model.memory_bytes - sum(used) < min(used):
        return "memory"
    return "room"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value / 3600:.2f} h"


def table(r: RunReport) -> str:
    """The report as aligned text."""
    lines = [
        f"fleet {r.fleet}: {r.hours:.1f} virtual hours, {r.gpus_mean:.0f} GPUs on average",
        f"  utilization over powered GPUs    {_pct(r.utilization_powered)}",
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
