"""The simulated cluster: nodes, GPUs, jobs, per-pool queues and the scheduler, under one lock.

``exporters.fleet.sim`` advances it from a background thread (``advance``); the control API
(``exporters.fleet.control``) and in-process callers mutate it through the operations in
``exporters.fleet.operations``; collectors read copies (``gpu_readings``, ``fleet_reading``).
Topology changes (nodes added, removed, failed, restored) call ``on_topology`` after the lock
is released, so the owner can open/close listeners and rewrite file_sd.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable

from exporters.fleet.config import (
    GPU_MODELS,
    PROFILES,
    FleetConfig,
    JobSpec,
    PoolSpec,
    default_workload,
)
from exporters.fleet.errors import BadRequest, Conflict, NotFound
from exporters.fleet.model import (
    FleetReading,
    Gpu,
    GpuReading,
    Job,
    Node,
    profile_memory_fraction,
    profile_utilization,
)

log = logging.getLogger(__name__)

NODE_STATES = ("up", "failed", "drained")


class Cluster:
    """All fleet state. Every public method takes ``lock``; it is re-entrant."""

    def __init__(self, config: FleetConfig, on_topology: Callable[[], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.lock = threading.RLock()
        self.on_topology = on_topology
        self.time = 0.0
        self.nodes: dict[str, Node] = {}
        self.pools: dict[str, PoolSpec] = {p.name: p for p in config.pools}
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, list[str]] = {p.name: [] for p in config.pools}
        self.counters = {
            "reclaimed": 0,
            "migrated": 0,
            "nodes_added": 0,
            "downclocked": 0,
            "restored": 0,
        }
        self.arrival_rate_per_min = config.arrival_rate_per_min
        self.rng = random.Random(config.seed)
        self._id_rng = random.Random(f"{config.seed}-identity")
        self._node_seq = 0
        self._job_seq = 0
        self._next_arrival = math.inf
        for pool in config.pools:
            for _ in range(pool.nodes):
                self.add_node(pool.name)
        workload = config.initial_jobs
        for spec in default_workload(config) if workload is None else workload:
            self.submit(spec)
        self._reset_arrivals()
        self.advance(0.0)

    # --- building blocks (callers hold the lock) -------------------------------------------

    def add_node(self, pool_name: str) -> Node:
        pool = self.pools[pool_name]
        model = GPU_MODELS[pool.model]
        seq = self._node_seq
        self._node_seq += 1
        gpus = [
            Gpu(
                index=i,
                uuid=self._new_uuid(),
                model=model,
                pci_bus_id=f"00000000:{0x10 + i * 0x10:02X}:00.0",
            )
            for i in range(pool.gpus_per_node)
        ]
        node = Node(name=f"node-{seq}", pool=pool.name, model=model, gpus=gpus, seq=seq)
        self.nodes[node.name] = node
        return node

    def _new_uuid(self) -> str:
        h = f"{self._id_rng.getrandbits(128):032x}"
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def find_gpu(self, uuid: str) -> tuple[Node, Gpu]:
        for node in self.nodes.values():
            for gpu in node.gpus:
                if gpu.uuid == uuid:
                    return node, gpu
        raise NotFound(f"no GPU with uuid {uuid!r}")

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound(f"no node named {name!r}") from None

    def pool(self, name: str) -> PoolSpec:
        try:
            return self.pools[name]
        except KeyError:
            raise NotFound(f"no pool named {name!r}; pools: {', '.join(self.pools)}") from None

    def job(self, job_id: str) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise NotFound(f"no queued or running job {job_id!r}") from None

    def notify_topology(self) -> None:
        """Tell the owner that nodes changed; call without holding the lock."""
        if self.on_topology is not None:
            self.on_topology()

    # --- jobs and scheduling -----------------------------------------------------------------

    def submit(self, spec: JobSpec) -> Job:
        """Validate and add a job: placed now when it fits, else queued in its pool."""
        with self.lock:
            job = self._new_job(spec)
            if spec.gpu_uuids or spec.node is not None:
                self._place_pinned(job, spec)
            else:
                self.queues[job.pool].append(job.id)
                self.jobs[job.id] = job
                self.schedule()
            return job

    def _new_job(self, spec: JobSpec) -> Job:
        if spec.profile not in PROFILES:
            raise BadRequest(f"profile {spec.profile!r} is unknown; use one of {list(PROFILES)}")
        if spec.gpus < 1:
            raise BadRequest(f"gpus must be >= 1, got {spec.gpus}")
        if spec.duration_s is not None and spec.duration_s <= 0:
            raise BadRequest(f"duration_s must be > 0, got {spec.duration_s}")
        pool_name = self.node(spec.node).pool if spec.node is not None else spec.pool
        pool = self.pool(pool_name)
        if spec.gpus > pool.gpus_per_node:
            raise BadRequest(
                f"gpus {spec.gpus} exceeds the {pool.gpus_per_node} GPUs per node of pool "
                f"{pool.name!r}; the job could never be placed"
            )
        fraction = spec.memory_fraction
        if fraction is None:
            fraction = profile_memory_fraction(spec.profile)
        if not 0.0 <= fraction <= 1.0:
            raise BadRequest(f"memory_fraction must be within [0, 1], got {fraction}")
        self._job_seq += 1
        return Job(
            id=f"job-{self._job_seq}",
            project=spec.project,
            profile=spec.profile,
            gpus=spec.gpus,
            pool=pool.name,
            priority=spec.priority,
            duration_s=spec.duration_s,
            memory_fraction=fraction,
            submitted_at=self.time,
            phase=self.rng.uniform(0, 2 * math.pi),
        )

    def _place_pinned(self, job: Job, spec: JobSpec) -> None:
        if spec.gpu_uuids:
            found = [self.find_gpu(u) for u in spec.gpu_uuids]
            nodes = {n.name for n, _ in found}
            if len(nodes) != 1:
                raise BadRequest(f"gpu_uuids span nodes {sorted(nodes)}; a job runs on one node")
            node = found[0][0]
            if spec.node is not None and spec.node != node.name:
                raise BadRequest(f"gpu_uuids are on {node.name}, not on node {spec.node!r}")
            if len(found) != job.gpus:
                raise BadRequest(f"gpus is {job.gpus} but {len(found)} gpu_uuids were given")
            gpus = [g for _, g in found]
        else:
            node = self.node(str(spec.node))
            gpus = node.free_gpus()[: job.gpus]
        busy = [g.uuid for g in gpus if g.job is not None]
        if not node.schedulable:
            raise Conflict(f"node {node.name} is {node.state}; nothing can be placed on it")
        if busy or len(gpus) < job.gpus:
            raise Conflict(
                f"node {node.name} has {len(node.free_gpus())} free GPUs"
                + (f"; busy: {busy}" if busy else "")
                + f"; the job needs {job.gpus}"
            )
        self.jobs[job.id] = job
        self._start(job, node, gpus)

    def _start(self, job: Job, node: Node, gpus: list[Gpu]) -> None:
        for gpu in gpus:
            gpu.job = job.id
        job.state = "running"
        job.node = node.name
        job.gpu_uuids = [g.uuid for g in gpus]
        if job.remaining_s is None:
            job.remaining_s = job.duration_s

    def release(self, job: Job) -> list[str]:
        """Free the job's GPUs and drop it from the cluster; returns the freed uuids."""
        freed = self._unplace(job)
        self.jobs.pop(job.id, None)
        queue = self.queues.get(job.pool, [])
        if job.id in queue:
            queue.remove(job.id)
        return freed

    def _unplace(self, job: Job) -> list[str]:
        freed: list[str] = []
        node = self.nodes.get(job.node or "")
        if node is not None:
            for gpu in node.gpus:
                if gpu.job == job.id:
                    gpu.job = None
                    freed.append(gpu.uuid)
        job.node = None
        job.gpu_uuids = []
        job.state = "queued"
        return freed

    def requeue(self, job: Job) -> None:
        self._unplace(job)
        self.queues[job.pool].append(job.id)

    def schedule(self) -> None:
        """Place queued jobs, highest priority then oldest first, best fit, with backfill."""
        with self.lock:
            for pool, queue in self.queues.items():
                order = sorted(
                    queue, key=lambda j: (-self.jobs[j].priority, self.jobs[j].submitted_at)
                )
                for job_id in order:
                    job = self.jobs[job_id]
                    node = self.best_fit(pool, job.gpus)
                    if node is None:
                        continue
                    queue.remove(job_id)
                    self._start(job, node, node.free_gpus()[: job.gpus])

    def best_fit(self, pool: str, gpus: int, exclude: str = "") -> Node | None:
        """The schedulable node of ``pool`` with the fewest free GPUs that still fit ``gpus``."""
        fits = [
            n
            for n in self.nodes.values()
            if n.pool == pool and n.schedulable and n.name != exclude and len(n.free_gpus()) >= gpus
        ]
        return min(fits, key=lambda n: (len(n.free_gpus()), n.seq), default=None)

    # --- time --------------------------------------------------------------------------------

    def _reset_arrivals(self) -> None:
        rate = self.arrival_rate_per_min / 60.0
        self._next_arrival = self.time + self.rng.expovariate(rate) if rate > 0 else math.inf

    def set_arrival_rate(self, rate_per_min: float) -> float:
        """Change the background arrival rate; returns the previous one."""
        if not (rate_per_min >= 0 and math.isfinite(rate_per_min)):
            raise BadRequest(f"rate_per_min must be a finite number >= 0, got {rate_per_min}")
        with self.lock:
            previous = self.arrival_rate_per_min
            self.arrival_rate_per_min = rate_per_min
            self._reset_arrivals()
            return previous

    def _random_job(self) -> JobSpec:
        cfg = self.config
        pool = self.rng.choice(sorted(self.pools))
        profiles = [p for p, _ in cfg.job_mix]
        weights = [w for _, w in cfg.job_mix]
        profile = self.rng.choices(profiles, weights)[0]
        gpus = min(self.rng.choice(cfg.job_gpus), self.pools[pool].gpus_per_node)
        low, high = cfg.job_duration_s
        return JobSpec(
            profile=profile,
            gpus=gpus,
            project=self.rng.choice(cfg.projects),
            pool=pool,
            duration_s=self.rng.uniform(low, high),
        )

    def advance(self, dt: float) -> None:
        """Move simulated time by ``dt`` seconds: finish jobs, arrivals, schedule, readings."""
        with self.lock:
            self.time += dt
            for job in list(self.jobs.values()):
                node = self.nodes.get(job.node or "")
                if job.state != "running" or job.remaining_s is None or node is None:
                    continue
                if node.failed:
                    continue
                job.remaining_s -= dt
                if job.remaining_s <= 0:
                    log.debug("%s finished on %s", job.id, job.node)
                    self.release(job)
            while self._next_arrival <= self.time:
                self.submit(self._random_job())
                self._next_arrival += self.rng.expovariate(self.arrival_rate_per_min / 60.0)
            self.schedule()
            for node in self.nodes.values():
                if node.failed:
                    continue
                for gpu in node.gpus:
                    holder = self.jobs.get(gpu.job or "")
                    if holder is None:
                        gpu.step(dt, 0.0, 0.0)
                    else:
                        util = profile_utilization(
                            holder.profile, self.time, holder.phase, self.rng
                        )
                        gpu.step(dt, util, holder.memory_fraction)

    # --- views ---------------------------------------------------------------------------------

    def gpu_readings(self, node_name: str) -> list[GpuReading]:
        with self.lock:
            node = self.nodes.get(node_name)
            if node is None:
                return []
            return [GpuReading.of(node, gpu) for gpu in node.gpus]

    def fleet_reading(self) -> FleetReading:
        with self.lock:
            allocations = []
            for node in self.nodes.values():
                for gpu in node.gpus:
                    job = self.jobs.get(gpu.job or "")
                    allocations.append(
                        (node.name, gpu.uuid, job.id if job else "", job.project if job else "")
                    )
            nodes = {(p, s): 0 for p in self.pools for s in NODE_STATES}
            for node in self.nodes.values():
                nodes[(node.pool, node.state)] += 1
            running = dict.fromkeys(self.pools, 0)
            for job in self.jobs.values():
                if job.state == "running":
                    running[job.pool] += 1
            return FleetReading(
                allocations=tuple(allocations),
                queue={p: len(q) for p, q in self.queues.items()},
                nodes=nodes,
                running=running,
                migrated=self.counters["migrated"],
                reclaimed=self.counters["reclaimed"],
            )

    def state(self) -> dict[str, object]:
        """The document ``GET /api/v1/state`` returns."""
        with self.lock:
            nodes = []
            for node in self.nodes.values():
                gpus = []
                for gpu in node.gpus:
                    job = self.jobs.get(gpu.job or "")
                    gpus.append(
                        {
                            "index": gpu.index,
                            "uuid": gpu.uuid,
                            "job": job.id if job else None,
                            "project": job.project if job else None,
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
                        "gpus": gpus,
                    }
                )
            return {
                "time": self.time,
                "nodes": nodes,
                "queue": {p: len(q) for p, q in self.queues.items()},
                "jobs": [j.to_json() for j in self.jobs.values()],
                "counters": dict(self.counters),
                "arrival_rate_per_min": self.arrival_rate_per_min,
            }
