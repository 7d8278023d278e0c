"""What the fleet's readers see: the fleet reading (``FleetReading``, the ``gpuops_*`` series)
with the drainable nodes, a node's GPU readings, and the state document of the control API.

Called through ``Cluster.fleet_reading``, ``Cluster.gpu_readings``, ``Cluster.drainable`` and
``Cluster.state`` (``gpuops.sim.fleet.cluster``) by the collectors
(``gpuops.sim.fleet.collectors``), the virtual fleet (``gpuops.sim.fleet.virtual``) and the
control API (``gpuops.sim.fleet.control``). Each takes the cluster lock, reads, and returns
copies; nothing here changes the fleet (a consolidation plan or a pack target asked here is
only a plan).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from gpuops.sim.fleet.consolidation import Claim
from gpuops.sim.fleet.errors import Conflict
from gpuops.sim.fleet.model import POWERED_DOWN_KEPT_S, FleetReading, GpuReading, Job, Node

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster

NODE_STATES = ("up", "failed", "drained", "booting")


def gpu_readings(cluster: Cluster, node_name: str) -> list[GpuReading]:
    with cluster.lock:
        node = cluster.nodes.get(node_name)
        if node is None:
            return []
        return [GpuReading.of(node, gpu) for gpu in node.gpus]


def _pools_with_a_free_slice(cluster: Cluster) -> frozenset[str]:
    """Pools with a shared GPU on a schedulable node that has a slice free (memory aside):
    where ``Slices.pack_target`` could find room, so that a reading asks it (O(jobs) per
    pool) only for jobs that have somewhere to go (at 682 GPUs with the sharing pools full
    and light jobs on every rented H100: 363 ms a reading asking every job, 1.0 ms so)."""
    return frozenset(
        n.pool
        for n in cluster.nodes.values()
        if n.schedulable
        and (spec := cluster.pools[n.pool]).sharing is not None
        and any(g.job is None and g.tenants and len(g.tenants) < spec.slices for g in n.gpus)
    )


def fleet_reading(cluster: Cluster) -> FleetReading:
    c = cluster
    with c.lock:
        scheduler = c.scheduler
        slices = scheduler.slices
        allocations = []
        sharing = []
        borrowed: list[tuple[str, str]] = []
        lends_slices = c.config.scheduler.slice_borrowing
        sizes = functools.cache(scheduler.slice_sizes)  # once per reading, if asked
        open_pools = functools.cache(functools.partial(_pools_with_a_free_slice, c))
        admission = scheduler.admission()  # read only if a job is asked about
        packable: dict[str, bool] = {}  # job -> pack would move it now, once per reading

        def pack_now(job: Job, node: Node) -> bool:
            # a job's GPUs are on one node: asked once; it holds none of a pool that can
            # share, so one admission serves all (its own usage counts in no pool asked)
            if job.id not in packable:
                packable[job.id] = any(p in open_pools() for p in job.pools or (job.pool,)) and (
                    scheduler.pack_target(job, node, admission) is not None
                )
            return packable[job.id]

        for node in c.nodes.values():
            can_share = c.pools[node.pool].sharing is not None
            for gpu in node.gpus:
                job = c.jobs.get(gpu.job or (gpu.tenants[0] if gpu.tenants else ""))
                allocations.append(
                    (node.name, gpu.uuid, job.id if job else "", job.project if job else "")
                )
                # a GPU held whole by a job that cannot share, or by one on borrowed
                # capacity where the fleet does not lend slices, is left out: ``pack``
                # would refuse it (409), so the policies downclock it instead
                shares = (
                    job is not None
                    and job.shareable
                    and (not job.borrowed or lends_slices)
                    and slices.fits_a_slice(job, node.pool, gpu)
                )
                if can_share and (job is None or job.shared or shares):
                    sharing.append((node.name, gpu.uuid, len(gpu.tenants)))
                elif (
                    shares
                    and job is not None
                    and slices.shares_elsewhere(job, sizes())
                    and pack_now(job, node)
                ):
                    # held whole where its pool cannot share: ``pack`` moves it onto a slice
                    # of another of its pools (a light job on a rented H100 would keep the
                    # rental powered at 25 %), listed only while one has a slice for it now;
                    # until then the downclock policy caps it (listed with the sharing pool
                    # powered down, it would stay at full clocks, ``pack`` answering
                    # left_whole)
                    sharing.append((node.name, gpu.uuid, 0))
                if any(c.jobs[j].borrowed for j in gpu.tenants) or (
                    job is not None and job.borrowed
                ):
                    borrowed.append((node.name, gpu.uuid))
        nodes = {(p, s): 0 for p in c.pools for s in NODE_STATES}
        for node in c.nodes.values():
            nodes[(node.pool, node.state)] += 1
        running = dict.fromkeys(c.pools, 0)
        for job in c.jobs.values():
            if job.state == "running":
                running[job.pool] += 1
        held = scheduler.held
        queue = {p: len(q) for p, q in c.queues.items()}
        held_queue = {
            p: sum(c.jobs[j].priority_class in held for j in q) for p, q in c.queues.items()
        }
        drainable_now = drainable(c)
        booting = tuple(
            sorted(
                (n.name, n.pool, int(n.booting_until is not None))
                for n in c.nodes.values()
                if not n.failed
            )
        )
        kept_since = c.time - POWERED_DOWN_KEPT_S
        powered_down = tuple(
            sorted((n, pool) for n, (pool, at) in c.powered_down.items() if at >= kept_since)
        )
        # energy and scheduling
        tariff = c.config.tariff
        power = dict.fromkeys(c.pools, 0.0)
        project_gpus: dict[str, int] = {}
        for node in c.nodes.values():
            if not node.failed:
                power[node.pool] += node.host_power + sum(g.power for g in node.gpus)
        class_queue = dict.fromkeys(c.priority_classes, 0)
        for job in c.jobs.values():
            if job.state == "running":
                project_gpus[job.project] = project_gpus.get(job.project, 0) + job.gpus
            elif job.priority_class:
                class_queue[job.priority_class] = class_queue.get(job.priority_class, 0) + 1
        completed = dict.fromkeys(c.priority_classes, 0)
        for pc, _project, _wait, _jct in c.completed:
            completed[pc] = completed.get(pc, 0) + 1
        return FleetReading(
            allocations=tuple(allocations),
            queue=queue,
            held_queue=held_queue,
            nodes=nodes,
            running=running,
            migrated=c.counters["migrated"],
            reclaimed=c.counters["reclaimed"],
            sharing=tuple(sharing),
            borrowed=tuple(borrowed),
            drainable=drainable_now,
            booting=booting,
            powered_down=powered_down,
            power_watts=power,
            energy_joules=dict(c.energy_joules),
            energy_cost=c.energy_cost,
            price_per_kwh=c.price_per_kwh(),
            off_peak_price_per_kwh=tariff.lowest_price(),
            period=tariff.period_name(c.hour_of_day()),
            currency=tariff.currency,
            class_queue=class_queue,
            held={n: n in held for n, pc in c.priority_classes.items() if pc.holdable},
            quotas=scheduler.quotas(),
            demand=scheduler.demand(),
            borrow_demand=scheduler.borrow_demand(),
            lending={p: p in scheduler.lending for p in c.pools},
            project_gpus=project_gpus,
            preemptions=dict(scheduler.preemptions),
            credit_gpu_s=dict(scheduler.credit_gpu_s),
            completed=completed,
            work_gpu_s=c.work_gpu_s,
        )


def drainable(cluster: Cluster) -> tuple[tuple[str, str, int], ...]:
    """(node, pool, 1 or 0) for every up node: 1 when ``consolidate`` would empty it now
    (``Consolidation.drain_plan``). The plans are made together, emptiest node first, so
    that two nodes are never both drainable onto the same free GPUs, nor one onto the other
    (a node that an earlier plan moves jobs onto is not drainable)."""
    with cluster.lock:
        claim = Claim()
        up = [n for n in cluster.nodes.values() if n.schedulable]
        up.sort(key=lambda n: (len(n.gpus) - len(n.free_gpus()), -n.seq))
        out = []
        for node in up:
            used = len(node.gpus) - len(node.free_gpus())
            ok = 0
            if used and 2 * used <= len(node.gpus):
                try:
                    cluster.scheduler.drain_plan(node, claim)
                    ok = 1
                except Conflict:
                    pass
            out.append((node.name, node.pool, ok))
        return tuple(sorted(out))


def state(cluster: Cluster) -> dict[str, object]:
    """The document ``GET /api/v1/state`` returns (JSON, the control API's)."""
    c = cluster
    with c.lock:
        nodes = []
        for node in c.nodes.values():
            gpus = []
            for gpu in node.gpus:
                job = c.jobs.get(gpu.job or "")
                gpus.append(
                    {
                        "index": gpu.index,
                        "uuid": gpu.uuid,
                        "job": job.id if job else None,
                        "project": job.project if job else None,
                        "tenants": list(gpu.tenants),
                        "utilization": round(gpu.utilization, 4),
                        "clock_locked_mhz": gpu.clock_locked_mhz,
                        "max_clock_mhz": gpu.max_clock_mhz,
                    }
                )
            nodes.append(
                {
                    "name": node.name,
                    "pool": node.pool,
                    "state": node.state,
                    "port": node.port,
                    "model": node.model.short,
                    "driver_version": node.driver_version,
                    "gpus": gpus,
                }
            )
        scheduler = c.scheduler
        return {
            "time": c.time,
            "nodes": nodes,
            "queue": {p: len(q) for p, q in c.queues.items()},
            "jobs": [j.to_json() for j in c.jobs.values()],
            "counters": dict(c.counters),
            "arrival_rate_per_min": c.arrival_rate_per_min,
            "hour_of_day": round(c.hour_of_day(), 4),
            "price_per_kwh": c.price_per_kwh(),
            "quotas": [
                {"project": p, "pool": pool, "gpus": n}
                for (p, pool), n in scheduler.quotas().items()
            ],
            "grants": [g.to_json() for g in scheduler.grants.values()],
            "held_classes": sorted(scheduler.held),
            "lending_pools": sorted(scheduler.lending),
            "preemptions": dict(scheduler.preemptions),
            "credit_gpu_s": dict(scheduler.credit_gpu_s),
        }
