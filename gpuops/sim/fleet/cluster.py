"""The simulated cluster: nodes, GPUs, jobs, per-pool queues and the scheduler, under one lock.

``gpuops.sim.fleet.sim`` advances it from a background thread (``advance``); the control API
(``gpuops.sim.fleet.control``) and in-process callers mutate it through the operations in
``gpuops.sim.fleet.operations``; collectors read copies (``gpu_readings``, ``fleet_reading``).
Topology changes (nodes added, removed, failed, restored) call ``on_topology`` after the lock
is released, so the owner can open/close listeners and rewrite file_sd.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
from collections.abc import Callable
from typing import Any

from gpuops.sim.fleet.config import (
    GIB,
    GPU_MODELS,
    PROFILES,
    FleetConfig,
    GpuModel,
    JobSpec,
    PoolSpec,
    default_workload,
)
from gpuops.sim.fleet.energy import JOULES_PER_KWH, host_power_watts, throughput
from gpuops.sim.fleet.errors import BadRequest, Conflict, NotFound
from gpuops.sim.fleet.model import (
    SESSION_IDLE_UTILIZATION,
    SESSION_PROFILES,
    FleetReading,
    Gpu,
    GpuReading,
    Job,
    Node,
    profile_memory_fraction,
    profile_utilization,
)
from gpuops.sim.fleet.scheduler import Admission, Claim, Scheduler
from gpuops.sim.fleet.sharing import fits, gpu_utilization, progress_rates
from gpuops.sim.fleet.workload import Arrivals, PriorityClass

NO_CLASS = PriorityClass("", 0)
"""The class of jobs submitted without one: plain ``priority`` ordering, never preempting."""

log = logging.getLogger(__name__)

NODE_STATES = ("up", "failed", "drained", "booting")


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
            "packed": 0,
            "consolidated": 0,
            "moved": 0,
            "culled": 0,
        }
        self.arrival_rate_per_min = config.arrival_rate_per_min
        """Background arrivals per minute; with job classes, their total mean rate."""
        self.rng = random.Random(config.seed)
        self._id_rng = random.Random(f"{config.seed}-identity")
        self._node_seq = 0
        self._rates: dict[str, float] = {}
        self._clock_rates: dict[str, float] = {}

        self._job_seq = 0
        self._next_arrival = math.inf
        self.priority_classes = {pc.name: pc for pc in config.priority_classes}
        self.scheduler = Scheduler(self)
        self.arrivals = (
            Arrivals(config.job_classes, config.seed, config.start_hour)
            if config.job_classes
            else None
        )
        if self.arrivals is not None:
            self.arrival_rate_per_min = sum(jc.rate_per_hour for jc in config.job_classes) / 60
        self.energy_joules: dict[str, float] = {p.name: 0.0 for p in config.pools}
        """Energy of every node per pool since start, its GPUs and its host (removed nodes'
        included)."""
        self.energy_cost = 0.0
        """What that energy cost at the tariff's price when it was drawn."""
        self.reclaimed_gpu_s = 0.0
        """GPU-seconds the reclaimed jobs would still have held (0 for open-ended ones)."""
        self.work_gpu_s = 0.0
        """GPU-seconds of job progress at full-clock speed (throughput, for the what-if), in
        A100-equivalents (``GpuModel.speed``)."""
        self.downclock_lost_gpu_s = 0.0
        """GPU-seconds of progress lost to clock locks (full-clock work not done while
        running slower): the throughput cost of downclocking."""
        self.share_lost_gpu_s = 0.0
        """GPU-seconds of progress lost to sharing a GPU (contention, context switches)."""
        self.restart_lost_gpu_s = 0.0
        """GPU-seconds a restart costs jobs stopped and started again (reclaim, pack,
        consolidate): their relaunch (GPUs held, idle) and the work they do again."""
        self.redo_busy_gpu_s = 0.0
        """GPU-seconds of utilization spent doing lost work again (counted as busy in
        utilization over powered GPUs; the report shows the figure without it too)."""
        self._active: dict[str, float] = {}
        """job -> the part of the last step it ran (the rest it relaunched); absent: all."""
        self._redo: dict[str, float] = {}
        """job -> the part of its last step's progress that was work done again."""
        self.completed_gpu_s = 0.0
        """GPU-seconds (at full clock) the completed jobs asked for: the work delivered."""
        self.completed: list[tuple[str, str, float, float]] = []
        """(priority class, project, queue wait s, completion time s) of finished jobs."""
        self.culled_sessions: list[tuple[str, str, float, float]] = []
        """The same for notebook sessions ``cull`` ended: not finished jobs (the report shows
        them apart, and the completion time with and without them)."""
        for pool in config.pools:
            for _ in range(pool.nodes):
                self.add_node(pool.name)
        workload = config.initial_jobs
        for spec in default_workload(config) if workload is None else workload:
            self.submit(spec)
        self._reset_arrivals()
        self.advance(0.0)

    # --- building blocks (callers hold the lock) -------------------------------------------

    def add_node(self, pool_name: str, boot: bool = False) -> Node:
        """A new node of ``pool_name``; with ``boot``, a machine powered up now, schedulable
        after the pool's ``boot_s``."""
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
        node.host_idle_power = node.host_power = pool.host_idle_watts
        if boot and pool.boot_s > 0:
            node.booting_until = self.time + pool.boot_s
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

    def priority_class(self, name: str) -> PriorityClass:
        if not name:
            return NO_CLASS
        try:
            return self.priority_classes[name]
        except KeyError:
            known = ", ".join(sorted(self.priority_classes)) or "none"
            raise NotFound(f"no priority class {name!r}; classes: {known}") from None

    def hour_of_day(self) -> float:
        return (self.config.start_hour + self.time / 3600.0) % 24.0

    def price_per_kwh(self) -> float:
        return self.config.tariff.price(self.hour_of_day())

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
                job.waiting_since = self.time
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
        pc = self.priority_class(spec.priority_class)
        pool_name = self.node(spec.node).pool if spec.node is not None else spec.pool
        pools = (pool_name,) if pool_name else self.candidate_pools(pc, spec)
        pool = self.pool(pools[0])
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
            priority=pc.priority if spec.priority_class else spec.priority,
            duration_s=spec.duration_s,
            memory_fraction=fraction,
            submitted_at=self.time,
            phase=self.rng.uniform(0, 2 * math.pi),
            pools=pools,
            job_class=spec.job_class,
            priority_class=pc.name,
            memory_gib=spec.memory_gib,
            checkpoint_interval_s=spec.checkpoint_interval_s,
            shareable=spec.shareable,
        )

    def candidate_pools(self, pc: PriorityClass, spec: JobSpec) -> tuple[str, ...]:
        """Pools a job may run in, best first: the class's preferred models in its order, then
        (with fallback) the others; only pools whose GPUs have the memory and count it needs."""
        fits = [
            p
            for p in self.pools.values()
            if p.gpus_per_node >= spec.gpus
            and (
                spec.memory_gib is None or GPU_MODELS[p.model].memory_bytes >= spec.memory_gib * GIB
            )
        ]
        rank = {m: i for i, m in enumerate(pc.models)}
        preferred = [p for p in fits if not pc.models or p.model in rank]
        preferred.sort(key=lambda p: (rank.get(p.model, 0), p.cloud))
        rest = [p for p in fits if p not in preferred] if pc.fallback else []
        rest.sort(key=lambda p: (p.cloud, -GPU_MODELS[p.model].memory_bytes))
        pools = tuple(p.name for p in preferred + rest)
        if not pools:
            raise BadRequest(
                f"no pool can take a job of {spec.gpus} GPUs"
                + (f" with {spec.memory_gib} GiB each" if spec.memory_gib else "")
                + (f" on models {list(pc.models)}" if pc.models and not pc.fallback else "")
            )
        return pools

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
        self.start(job, node, gpus)

    def start(self, job: Job, node: Node, gpus: list[Gpu]) -> None:
        """Run ``job`` on ``gpus`` of ``node`` (the scheduler picked them)."""
        for gpu in gpus:
            gpu.job = job.id
        job.state = "running"
        job.node = node.name
        job.gpu_uuids = [g.uuid for g in gpus]
        job.started_at = self.time
        # a restarted job relaunches first: its GPUs held but idle (``restart_cost``)
        job.restarting_until = self.time + job.relaunch_s if job.relaunch_s > 0 else None
        job.relaunch_s = 0.0
        if job.first_started_at is None:
            job.first_started_at = self.time
        if job.remaining_s is None:
            job.remaining_s = job.duration_s

    def start_shared(self, job: Job, node: Node, gpus: list[Gpu]) -> None:
        """Run ``job`` on one slice of each of ``gpus`` (shared GPUs of ``node``)."""
        for gpu in gpus:
            gpu.tenants.append(job.id)
        self.start(job, node, [])
        job.gpu_uuids = [g.uuid for g in gpus]
        job.shared = True

    def job_bytes(self, job: Job, gpu: Gpu) -> int:
        """GPU memory ``job`` uses on ``gpu``: its ``memory_gib``, else its profile's share."""
        return self.job_bytes_on(job, gpu.model)

    @staticmethod
    def job_bytes_on(job: Job, model: GpuModel) -> int:
        """GPU memory ``job`` uses on a GPU of ``model`` (``job_bytes``)."""
        if job.memory_gib is not None:
            return int(job.memory_gib * GIB)
        return int(model.memory_bytes * job.memory_fraction)

    def restart_cost(self, job: Job) -> float:
        """Stop ``job`` to start it again elsewhere: its work since the last checkpoint (all of
        it without checkpoints; a session — notebook, inference service — keeps its place) goes
        back on its remaining time, done again at its usual load (``redo_s``); when it starts
        again it first relaunches for the fleet's ``restart_s``, its GPUs held but idle
        (``relaunch_s``, ``restarting_until``); ``moved_at`` says when
        (every restart — packed elsewhere, consolidated, reclaimed — goes through here, so
        ``scheduler.move_interval`` holds whichever verb moved it). Returns the GPU-seconds
        charged."""
        if job.remaining_s is None or job.duration_s is None:
            return 0.0
        done = job.duration_s - job.remaining_s
        if job.profile in SESSION_PROFILES:
            lost = 0.0
        elif job.checkpoint_interval_s is not None:
            lost = min(job.since_checkpoint_s, done)
        else:
            lost = done
        charged = lost + self.config.scheduler.restart_s
        job.remaining_s += lost
        job.redo_s += lost
        job.relaunch_s = self.config.scheduler.restart_s
        job.since_checkpoint_s = 0.0
        job.moved_at = self.time
        self.restart_lost_gpu_s += charged * job.gpus
        return charged * job.gpus

    def cull(self, job: Job) -> list[str]:
        """End notebook session ``job`` as an idle culler does (``CULLED_PROFILES``): its server
        stops and its GPUs go back; it is not requeued. Its user's next session is a new
        arrival of its class (``Arrivals``): the notebook profile has no activity after it
        went idle, so the user's next activity is a new session, not this one resumed.

        Not a finished job: recorded in ``culled_sessions`` (not ``completed``) with the
        completion time it would have had running to its end (its wait plus its whole session:
        the user's session was theirs however long the GPU was held), so the completion time
        that counts culled sessions is neither shortened nor lengthened by culling; its
        delivered GPU-seconds (``completed_gpu_s``) are only those it held, not the rest of
        its session. Returns the freed uuids."""
        started = job.first_started_at if job.first_started_at is not None else self.time
        held = (job.duration_s or 0.0) - (job.remaining_s or 0.0)
        self.completed_gpu_s += max(held, 0.0) * job.gpus
        self.culled_sessions.append(
            (
                job.priority_class,
                job.project,
                started - job.submitted_at,
                started - job.submitted_at + (job.duration_s or 0.0),
            )
        )
        self.counters["culled"] += 1
        return self.release(job)

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
                if job.id in gpu.tenants:
                    gpu.tenants.remove(job.id)
                    freed.append(gpu.uuid)
        job.node = None
        job.gpu_uuids = []
        job.state = "queued"
        job.shared = False
        return freed

    def requeue(self, job: Job) -> None:
        self._unplace(job)
        self.queues[job.pool].append(job.id)
        job.waiting_since = self.time

    def schedule(self) -> None:
        """Place queued jobs, highest priority then oldest first, best fit, with backfill,
        quotas and preemption (``gpuops.sim.fleet.scheduler``)."""
        with self.lock:
            self.scheduler.run()

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
        rate = self.arrival_rate_per_min / 60.0 if self.arrivals is None else 0.0
        self._next_arrival = self.time + self.rng.expovariate(rate) if rate > 0 else math.inf

    def set_arrival_rate(self, rate_per_min: float) -> float:
        """Change the background arrival rate; returns the previous one."""
        if not (rate_per_min >= 0 and math.isfinite(rate_per_min)):
            raise BadRequest(f"rate_per_min must be a finite number >= 0, got {rate_per_min}")
        with self.lock:
            previous = self.arrival_rate_per_min
            self.arrival_rate_per_min = rate_per_min
            self._reset_arrivals()
            if self.arrivals is not None:  # a fleet file's classes: scale them to that total
                base = sum(jc.rate_per_hour for jc in self.config.job_classes) / 60.0
                self.arrivals.rescale(rate_per_min / base if base > 0 else 0.0, self.time)
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
        """Move simulated time by ``dt`` seconds: job progress (slower under clock locks),
        finished jobs, arrivals, ended grants, scheduling, readings, energy and its cost."""
        with self.lock:
            self.time += dt
            for booting in self.nodes.values():
                if booting.booting_until is not None and booting.booting_until <= self.time:
                    booting.booting_until = None
            for job in list(self.jobs.values()):
                node = self.nodes.get(job.node or "")
                if job.state != "running" or job.remaining_s is None or node is None:
                    continue
                if node.failed:
                    continue
                ran = dt
                if job.restarting_until is not None:  # relaunching for part of the step
                    ran = min(max(self.time - job.restarting_until, 0.0), dt)
                    self._active[job.id] = ran / dt if dt > 0 else 0.0
                    if job.restarting_until <= self.time:
                        job.restarting_until = None
                # a session's duration is wall-clock time; work slows with clocks and sharing
                if job.profile in SESSION_PROFILES:
                    rate = 1.0
                else:
                    rate = self._rates.get(job.id, 1.0) * node.model.speed
                progress = ran * rate
                if job.redo_s > 0 and progress > 0:
                    redo = min(job.redo_s, progress)
                    job.redo_s -= redo
                    self._redo[job.id] = redo / progress
                job.remaining_s -= progress
                job.since_checkpoint_s += progress
                interval = job.checkpoint_interval_s
                if interval is not None and job.since_checkpoint_s >= interval:
                    job.since_checkpoint_s %= interval
                if job.remaining_s <= 0:
                    log.debug("%s finished on %s", job.id, job.node)
                    self._finished(job)
                    self.release(job)
            if self.arrivals is not None:
                for _at, jc in self.arrivals.due(self.time):
                    self.submit(self.arrivals.spec(jc, self.priority_class(jc.priority_class)))
            else:
                while self._next_arrival <= self.time:
                    self.submit(self._random_job())
                    self._next_arrival += self.rng.expovariate(self.arrival_rate_per_min / 60.0)
            expired = bool(self.scheduler.grants) and bool(self.scheduler.expire())
            self.schedule()
            self._step_gpus(dt)
        if expired:
            self.notify_topology()

    def _finished(self, job: Job) -> None:
        started = job.first_started_at if job.first_started_at is not None else self.time
        self.completed_gpu_s += (job.duration_s or 0.0) * job.gpus
        self.completed.append(
            (
                job.priority_class,
                job.project,
                started - job.submitted_at,
                self.time - job.submitted_at,
            )
        )

    def _step_gpus(self, dt: float) -> None:
        rates: dict[str, float] = {}
        joules = 0.0
        price = self.price_per_kwh()
        for node in self.nodes.values():
            if node.failed:
                continue
            before = 0.0
            for gpu in node.gpus:
                before += gpu.energy_joules
                if gpu.tenants:
                    self._step_shared(node.pool, gpu, dt, rates)
                    continue
                holder = self.jobs.get(gpu.job or "")
                if holder is None:
                    gpu.step(dt, 0.0, 0.0)
                    continue
                util = profile_utilization(holder.profile, self.time, holder.phase, self.rng)
                util *= self._active.get(holder.id, 1.0)
                if util > SESSION_IDLE_UTILIZATION:
                    holder.busy_at = self.time
                self.redo_busy_gpu_s += util * dt * self._redo.get(holder.id, 0.0)
                rate = gpu.step(dt, util, holder.memory_fraction, holder.profile)
                rates[holder.id] = min(rate, rates.get(holder.id, 1.0))
            drawn = sum(g.energy_joules for g in node.gpus) - before
            spec = self.pools[node.pool]
            load = sum(g.utilization for g in node.gpus) / len(node.gpus)
            node.host_power = host_power_watts(spec.host_idle_watts, spec.host_peak_watts, load)
            drawn += node.host_power * dt
            self.energy_joules[node.pool] += drawn
            joules += drawn
        for job_id, rate in rates.items():
            job = self.jobs[job_id]
            speed = self.nodes[str(job.node)].model.speed
            # in A100-equivalent GPUs, for the part of the step it ran (not relaunching)
            gpus = job.gpus * speed * self._active.get(job_id, 1.0)
            clock = self._clock_rates.get(job_id, rate)
            self.work_gpu_s += dt * rate * gpus
            # the clock lock's share of the loss, then what sharing took on top of it
            self.downclock_lost_gpu_s += dt * (1.0 - clock) * gpus
            self.share_lost_gpu_s += dt * (clock - rate) * gpus
        self._rates = rates
        self._clock_rates = {}
        self._active = {}
        self._redo = {}
        self.energy_cost += joules / JOULES_PER_KWH * price

    def _step_shared(self, pool: str, gpu: Gpu, dt: float, rates: dict[str, float]) -> None:
        """One step of a shared GPU: its jobs' demands, the GPU's load, each job's progress
        (``gpuops.sim.fleet.sharing``) under the GPU's clock lock."""
        spec = self.pools[pool]
        mode = spec.sharing or "time-slicing"
        tenants = [self.jobs[j] for j in gpu.tenants]
        demands = [
            profile_utilization(j.profile, self.time, j.phase, self.rng)
            * self._active.get(j.id, 1.0)
            for j in tenants
        ]  # a relaunching tenant asks nothing of the GPU
        for job, demand in zip(tenants, demands, strict=True):
            if demand > SESSION_IDLE_UTILIZATION:
                job.busy_at = self.time
        used = sum(self.job_bytes(j, gpu) for j in tenants)
        fraction = min(used / gpu.model.memory_bytes, 1.0)
        load = gpu_utilization(mode, demands, spec.slices)
        total = sum(demands)
        if total > 0:  # each tenant's part of the load, the redone part of it
            for job, demand in zip(tenants, demands, strict=True):
                self.redo_busy_gpu_s += load * dt * demand / total * self._redo.get(job.id, 0.0)
        gpu.step(dt, load, fraction)
        share = gpu.clock_limit_share()
        for job, rate in zip(tenants, progress_rates(mode, demands, spec.slices), strict=True):
            clock = throughput(job.profile, share)
            rates[job.id] = min(rate * clock, rates.get(job.id, 1.0))
            self._clock_rates[job.id] = min(clock, self._clock_rates.get(job.id, 1.0))

    # --- views ---------------------------------------------------------------------------------

    def gpu_readings(self, node_name: str) -> list[GpuReading]:
        with self.lock:
            node = self.nodes.get(node_name)
            if node is None:
                return []
            return [GpuReading.of(node, gpu) for gpu in node.gpus]

    def fits_a_slice(self, job: Job, pool: str, gpu: Gpu) -> bool:
        """Whether ``job`` fits one slice of ``gpu`` (a MIG slice holds ``1/slices`` of its
        memory; True when ``pool`` cannot share or ``job`` runs on slices already: nothing to
        check): one that does not, ``pack`` refuses to share in place (409), so the sharing
        series leaves its GPU out (with the pack policy repeating, it would be asked again
        every 30 minutes)."""
        spec = self.pools[pool]
        if spec.sharing is None or job.shared:
            return True
        return fits(spec.sharing, [], self.job_bytes(job, gpu), gpu.model.memory_bytes, spec.slices)

    def shares_elsewhere(
        self, job: Job, sizes: tuple[dict[str, int], dict[str, int]] | None = None
    ) -> bool:
        """Whether ``job``, shareable, may go on slices of a pool of its own that can share
        (``pack`` moves it there from a GPU of a pool that cannot, once a slice is free);
        ``sizes``: ``Scheduler.slice_sizes()``, read once per fleet reading."""
        if not job.shareable:
            return False
        for pool in job.pools or (job.pool,):
            spec = self.pools[pool]
            if spec.sharing is None or not self.scheduler.ever_admits_on_slices(job, pool, sizes):
                continue  # else pack could never move it: the GPU neither packed nor capped
            model = GPU_MODELS[spec.model]
            if fits(
                spec.sharing, [], self.job_bytes_on(job, model), model.memory_bytes, spec.slices
            ):
                return True
        return False

    def _pools_with_a_free_slice(self) -> frozenset[str]:
        """Pools with a shared GPU on a schedulable node that has a slice free (memory aside):
        where ``Scheduler.pack_target`` could find room, so that a reading asks it (O(jobs)
        per pool) only for jobs that have somewhere to go (review: 363 ms a reading at 682
        GPUs with the sharing pools full and light jobs on every rented H100, 1.0 ms without)."""
        return frozenset(
            n.pool
            for n in self.nodes.values()
            if n.schedulable
            and (spec := self.pools[n.pool]).sharing is not None
            and any(g.job is None and g.tenants and len(g.tenants) < spec.slices for g in n.gpus)
        )

    def fleet_reading(self) -> FleetReading:
        with self.lock:
            allocations = []
            sharing = []
            borrowed: list[tuple[str, str]] = []
            lends_slices = self.config.scheduler.slice_borrowing
            sizes = functools.cache(self.scheduler.slice_sizes)  # once per reading, if asked
            open_pools = functools.cache(self._pools_with_a_free_slice)
            admission = Admission(self.scheduler)  # read only if a job is asked about
            packable: dict[str, bool] = {}  # job -> pack would move it now, once per reading

            def pack_now(job: Job, node: Node) -> bool:
                # a job's GPUs are on one node: asked once; it holds none of a pool that can
                # share, so one admission serves all (its own usage counts in no pool asked)
                if job.id not in packable:
                    packable[job.id] = any(
                        p in open_pools() for p in job.pools or (job.pool,)
                    ) and (self.scheduler.pack_target(job, node, admission) is not None)
                return packable[job.id]

            for node in self.nodes.values():
                can_share = self.pools[node.pool].sharing is not None
                for gpu in node.gpus:
                    job = self.jobs.get(gpu.job or (gpu.tenants[0] if gpu.tenants else ""))
                    allocations.append(
                        (node.name, gpu.uuid, job.id if job else "", job.project if job else "")
                    )
                    # a GPU held whole by a job that cannot share, or by one on borrowed
                    # capacity where the fleet does not lend slices, is left out: ``pack``
                    # would refuse it (409), so the policies downclock it instead (issue 12's
                    # fifth-round review: a borrowed shareable job under 30 % got no action)
                    shares = (
                        job is not None
                        and job.shareable
                        and (not job.borrowed or lends_slices)
                        and self.fits_a_slice(job, node.pool, gpu)
                    )
                    if can_share and (job is None or job.shared or shares):
                        sharing.append((node.name, gpu.uuid, len(gpu.tenants)))
                    elif (
                        shares
                        and job is not None
                        and self.shares_elsewhere(job, sizes())
                        and pack_now(job, node)
                    ):
                        # held whole where its pool cannot share: ``pack`` moves it onto a
                        # slice of another of its pools (a light job on a rented H100 kept
                        # the rental powered at 25 % for hours before issue 12's ninth round),
                        # listed only while one has a slice for it now; until then the
                        # downclock policy caps it (tenth round: it stayed at full clocks
                        # with the sharing pool powered down, ``pack`` answering left_whole)
                        sharing.append((node.name, gpu.uuid, 0))
                    if any(self.jobs[j].borrowed for j in gpu.tenants) or (
                        job is not None and job.borrowed
                    ):
                        borrowed.append((node.name, gpu.uuid))
            nodes = {(p, s): 0 for p in self.pools for s in NODE_STATES}
            for node in self.nodes.values():
                nodes[(node.pool, node.state)] += 1
            running = dict.fromkeys(self.pools, 0)
            for job in self.jobs.values():
                if job.state == "running":
                    running[job.pool] += 1
            held = self.scheduler.held
            return FleetReading(
                allocations=tuple(allocations),
                queue={p: len(q) for p, q in self.queues.items()},
                held_queue={
                    p: sum(self.jobs[j].priority_class in held for j in q)
                    for p, q in self.queues.items()
                },
                nodes=nodes,
                running=running,
                migrated=self.counters["migrated"],
                reclaimed=self.counters["reclaimed"],
                sharing=tuple(sharing),
                borrowed=tuple(borrowed),
                drainable=self.drainable(),
                booting=tuple(
                    sorted(
                        (n.name, n.pool, int(n.booting_until is not None))
                        for n in self.nodes.values()
                        if not n.failed
                    )
                ),
                **self._energy_and_scheduling(),
            )

    def drainable(self) -> tuple[tuple[str, str, int], ...]:
        """(node, pool, 1 or 0) for every up node: 1 when ``consolidate`` would empty it now
        (``Scheduler.drain_plan``). The plans are made together, emptiest node first, so that
        two nodes are never both drainable onto the same free GPUs, nor one onto the other
        (a node that an earlier plan moves jobs onto is not drainable)."""
        with self.lock:
            claim = Claim()
            up = [n for n in self.nodes.values() if n.schedulable]
            up.sort(key=lambda n: (len(n.gpus) - len(n.free_gpus()), -n.seq))
            out = []
            for node in up:
                used = len(node.gpus) - len(node.free_gpus())
                ok = 0
                if used and 2 * used <= len(node.gpus):
                    try:
                        self.scheduler.drain_plan(node, claim)
                        ok = 1
                    except Conflict:
                        pass
                out.append((node.name, node.pool, ok))
            return tuple(sorted(out))

    def _energy_and_scheduling(self) -> dict[str, Any]:
        tariff = self.config.tariff
        power = dict.fromkeys(self.pools, 0.0)
        project_gpus: dict[str, int] = {}
        for node in self.nodes.values():
            if not node.failed:
                power[node.pool] += node.host_power + sum(g.power for g in node.gpus)
        class_queue = dict.fromkeys(self.priority_classes, 0)
        for job in self.jobs.values():
            if job.state == "running":
                project_gpus[job.project] = project_gpus.get(job.project, 0) + job.gpus
            elif job.priority_class:
                class_queue[job.priority_class] = class_queue.get(job.priority_class, 0) + 1
        completed = dict.fromkeys(self.priority_classes, 0)
        for pc, _project, _wait, _jct in self.completed:
            completed[pc] = completed.get(pc, 0) + 1
        held = self.scheduler.held
        return {
            "power_watts": power,
            "energy_joules": dict(self.energy_joules),
            "energy_cost": self.energy_cost,
            "price_per_kwh": self.price_per_kwh(),
            "off_peak_price_per_kwh": tariff.lowest_price(),
            "period": tariff.period_name(self.hour_of_day()),
            "currency": tariff.currency,
            "class_queue": class_queue,
            "held": {n: n in held for n, pc in self.priority_classes.items() if pc.holdable},
            "quotas": self.scheduler.quotas(),
            "demand": self.scheduler.demand(),
            "borrow_demand": self.scheduler.borrow_demand(),
            "lending": {p: p in self.scheduler.lending for p in self.pools},
            "project_gpus": project_gpus,
            "preemptions": dict(self.scheduler.preemptions),
            "credit_gpu_s": dict(self.scheduler.credit_gpu_s),
            "completed": completed,
            "work_gpu_s": self.work_gpu_s,
        }

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
                "hour_of_day": round(self.hour_of_day(), 4),
                "price_per_kwh": self.price_per_kwh(),
                "quotas": [
                    {"project": p, "pool": pool, "gpus": n}
                    for (p, pool), n in self.scheduler.quotas().items()
                ],
                "grants": [g.to_json() for g in self.scheduler.grants.values()],
                "held_classes": sorted(self.scheduler.held),
                "lending_pools": sorted(self.scheduler.lending),
                "preemptions": dict(self.scheduler.preemptions),
                "credit_gpu_s": dict(self.scheduler.credit_gpu_s),
            }
