"""The recorder: sums of the fleet's state over virtual time, observed at every scrape, and
the ``RunReport`` they make at the end.

``Recorder.observe`` is called by ``gpuops.sim.fleet.virtual`` at each scrape (and by tests
after each step); ``Recorder.report`` turns the sums into a ``RunReport``
(``gpuops.sim.fleet.report.figures``). The bounds on utilization are counted by
``gpuops.sim.fleet.report.bounds``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import GPU_MODELS
from gpuops.sim.fleet.energy import JOULES_PER_KWH
from gpuops.sim.fleet.model import Gpu
from gpuops.sim.fleet.report.bounds import Fewest
from gpuops.sim.fleet.report.figures import (
    ClassFigures,
    Point,
    PoolFigures,
    ProjectFigures,
    RunReport,
    WasteFigures,
)


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
    (``bounds.Fewest``)."""
    any_pool_s: float = 0.0
    """GPU-seconds they needed at least in any pool they may use (``bounds.Fewest``)."""

    def add(self, rates: _Sums, dt: float) -> None:
        """Add ``rates`` (GPUs and utilization sums at one instant) held for ``dt`` seconds."""
        self.powered_s += rates.powered_s * dt
        self.busy_s += rates.busy_s * dt
        self.allocated_s += rates.allocated_s * dt
        self.allocated_busy_s += rates.allocated_busy_s * dt
        self.pools_s += rates.pools_s * dt
        self.any_pool_s += rates.any_pool_s * dt


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile (nearest rank), None without values."""
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
        fewest = Fewest(cluster)
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
            preempted_in = dict(cluster.scheduler.preemption.by_class)
            restarts_in = dict(cluster.restarts)
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
            specs = dict(cluster.pools)
            served = list(cluster.served_sessions) + [
                (j.priority_class, j.served_s, j.slowed_s, j.over_objective_s)
                for j in cluster.jobs.values()
                if j.served_s > 0
            ]
            objectives = {
                jc.priority_class
                for jc in cluster.config.job_classes
                if jc.slowdown_objective is not None
            }
        done = finished + culled_rows  # the completion times count culled sessions whole
        by_class: dict[str, list[tuple[float, float]]] = defaultdict(list)
        by_project: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for pc, project, wait, jct in done:
            by_class[pc or "-"].append((wait, jct))
            by_project[project].append((wait, jct))
        culled_in: Counter[str] = Counter(pc or "-" for pc, *_ in culled_rows)
        culled_of: Counter[str] = Counter(project for _, project, *_ in culled_rows)
        sessions: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for pc, secs, slowed, over in served:
            sessions[pc or "-"].append((secs, slowed, over))
        classes = {
            pc: ClassFigures(
                completed=len(rows) - culled_in[pc],
                jct_mean_s=_mean([j for _, j in rows]),
                jct_p95_s=p95([j for _, j in rows]),
                wait_mean_s=_mean([w for w, _ in rows]),
                wait_p95_s=p95([w for w, _ in rows]),
                culled=culled_in[pc],
                preemptions=preempted_in.get(pc, 0),
                restarts=restarts_in.get(pc, 0),
                **_quality(sessions.get(pc, []), pc in objectives),
            )
            for pc, rows in (
                (pc, by_class.get(pc, []))
                for pc in sorted({*by_class, *sessions, *preempted_in, *restarts_in})
            )
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
        rental = sum(
            sums.powered_s / 3600.0 * specs[p].price_per_gpu_hour
            for p, sums in self.pools.items()
            if p in specs
        )
        weight = {p: GPU_MODELS[spec.model].fp16_tflops for p, spec in specs.items()}
        weighted_busy = sum(sums.busy_s * weight.get(p, 0.0) for p, sums in self.pools.items())
        weighted_powered = sum(
            sums.powered_s * weight.get(p, 0.0) for p, sums in self.pools.items()
        )
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
            jct_p95_s=p95([jct for *_, jct in done]),
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
            rental_cost=rental,
            total_cost=cost + rental,
            utilization_weighted=_ratio(weighted_busy, weighted_powered),
        )


def _quality(rows: list[tuple[float, float, float]], has_objective: bool) -> dict[str, Any]:
    """``ClassFigures.slowdown_p95`` and ``over_objective`` of a class's sessions."""
    if not rows:
        return {}
    served = sum(secs for secs, _, _ in rows)
    return {
        "slowdown_p95": p95([slowed / secs for secs, slowed, _ in rows]),
        "over_objective": (
            sum(over for *_, over in rows) / served if has_objective and served > 0 else None
        ),
    }


def _shared_limit(cluster: Cluster, pool: str, gpu: Gpu) -> str:
    """What keeps one more job off shared ``gpu`` (``WasteFigures.shared_limit``)."""
    if len(gpu.tenants) >= cluster.pools[pool].slices:
        return "slices"
    used = [cluster.job_bytes(cluster.jobs[j], gpu) for j in gpu.tenants]
    if gpu.model.memory_bytes - sum(used) < min(used):
        return "memory"
    return "room"
