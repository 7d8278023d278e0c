"""The simulated cluster: nodes, GPUs, jobs, per-pool queues and the scheduler, under one lock.

``gpuops.sim.fleet.sim`` advances it from a background thread (``advance``, which
``gpuops.sim.fleet.stepping`` carries out); the control API (``gpuops.sim.fleet.control``) and
in-process callers mutate it through the operations in ``gpuops.sim.fleet.operations``;
collectors read copies (``gpu_readings``, ``fleet_reading``: ``gpuops.sim.fleet.readings``).
This module holds the state, places pinned jobs, starts, stops and requeues jobs and charges
their restarts; the scheduler (``gpuops.sim.fleet.scheduler``) decides where queued jobs go.
Topology changes (nodes added, removed, failed, restored) call ``on_topology`` after the lock
is released, so the owner can open/close listeners and rewrite file_sd.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections import defaultdict
from collections.abc import Callable

from gpuops.sim.fleet import readings
from gpuops.sim.fleet.causes import Causes
from gpuops.sim.fleet.config import (
    GIB,
    GPU_MODELS,
    PROFILES,
    FleetConfig,
    GpuModel,
    JobSpec,
    PoolSpec,
    candidate_pools,
    default_workload,
)
from gpuops.sim.fleet.errors import BadRequest, Conflict, NotFound
from gpuops.sim.fleet.health import Healthy, NodeHealth
from gpuops.sim.fleet.model import (
    POWERED_DOWN_KEPT_S,
    SESSION_PROFILES,
    Finished,
    FleetReading,
    Gpu,
    GpuReading,
    Job,
    Node,
    profile_memory_fraction,
)
from gpuops.sim.fleet.scheduler import Scheduler
from gpuops.sim.fleet.stepping import Stepper
from gpuops.sim.fleet.workload import Arrivals, PriorityClass

NO_CLASS = PriorityClass("", 0)
"""The class of jobs submitted without one: plain ``priority`` ordering, never preempting."""

log = logging.getLogger(__name__)


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
            "requeued_by_migrate": 0,
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
        self._job_seq = 0
        self.stepper = Stepper(self)
        self.priority_classes = {pc.name: pc for pc in config.priority_classes}
        self.scheduler = Scheduler(self)
        self.arrivals = (
            Arrivals(config.job_classes, config.seed, config.start_hour)
            if config.job_classes
            else None
        )
        if self.arrivals is not None:
            self.arrival_rate_per_min = sum(jc.rate_per_hour for jc in config.job_classes) / 60
        self.causes = Causes()
        """Which decision stopped or acted on which jobs (for the what-if's harm limits)."""
        self.most_nodes: dict[str, int] = dict.fromkeys(self.pools, 0)
        """Pool -> the most nodes it has had at once, a quota grant's left out: its machines,
        where it has no ``max_nodes`` (``machines``)."""
        self.powered_down: dict[str, tuple[str, float]] = {}
        """Nodes powered down (removed) in the last ``POWERED_DOWN_KEPT_S``: name -> (pool,
        when), exported as ``gpuops_node_powered_down`` so a console tells a machine switched
        off from one that stopped answering."""
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
        consolidate, migrate): their relaunch (GPUs held, idle) and the work they do again."""
        self.health: NodeHealth = Healthy()
        """How its nodes answer the remediation ladder's steps (``gpuops.sim.fleet.health``)."""
        self.restarts: dict[str, int] = defaultdict(int)
        """Per priority class (``-``: a job of none), jobs ``restart_cost`` stopped to start
        again: reclaimed and requeued, packed elsewhere, moved by consolidation or a drain."""
        self.redo_busy_gpu_s = 0.0
        """GPU-seconds of utilization spent doing lost work again (counted as busy in
        utilization over powered GPUs; the report shows the figure without it too)."""
        self.completed_gpu_s = 0.0
        """GPU-seconds (at full clock) the completed jobs asked for: the work delivered."""
        self.completed: list[Finished] = []
        """Finished jobs: their class, project, queue wait and completion time."""
        self.culled_sessions: list[Finished] = []
        self.served_sessions: list[tuple[str, float, float, float]] = []
        """(priority class, seconds served, seconds times slowdown, seconds over its class's
        objective) of every session that left (``Job.served_s``; those still running are in
        ``jobs``)."""
        """The same for notebook sessions ``cull`` ended: not finished jobs (the report shows
        them apart, and the completion time with and without them)."""
        for pool in config.pools:
            for _ in range(pool.nodes):
                self.add_node(pool.name)
        workload = config.initial_jobs
        for spec in default_workload(config) if workload is None else workload:
            self.submit(spec)
        self.stepper.reset_arrivals()
        self.advance(0.0)

    # --- building blocks (callers hold the lock) -------------------------------------------

    def add_node(self, pool_name: str, boot: bool = False, granted: bool = False) -> Node:
        """A new node of ``pool_name``; with ``boot``, a machine powered up now, schedulable
        after the pool's ``boot_s``; ``granted``: a quota grant's, not one of the pool's
        machines (``machines``)."""
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
        node.driver_version = self.config.driver_version
        node.host_idle_power = node.host_power = pool.host_idle_watts
        if boot and pool.boot_s > 0:
            node.booting_until = self.time + pool.boot_s
        if boot:
            self.causes.powered_up(pool.name, self.time, self._oldest_wait())
        self.nodes[node.name] = node
        if not granted:
            present = sum(1 for n in self.nodes.values() if n.pool == pool.name)
            self.most_nodes[pool.name] = max(self.most_nodes[pool.name], present)
        return node

    def _oldest_wait(self) -> float:
        """When the longest wait of a queued job began (now, with none queued)."""
        queued = (self.jobs[j] for q in self.queues.values() for j in q)
        return min(
            (j.waiting_since if j.waiting_since is not None else j.submitted_at for j in queued),
            default=self.time,
        )

    def machines(self, pool_name: str) -> int:
        """The machines of ``pool_name``, powered or not, that a power-up can bring back: its
        ``max_nodes``, or without one the most nodes it has had at once (those of the fleet
        file and any ``scale_out`` added): a node powered down is a machine still there."""
        spec = self.pools[pool_name]
        return spec.max_nodes if spec.max_nodes is not None else self.most_nodes[pool_name]

    def power_down(self, name: str) -> Node:
        """Remove node ``name``, powered down (``scale_in``, ``consolidate``); it is
        remembered as powered down for ``POWERED_DOWN_KEPT_S``."""
        node = self.nodes.pop(name)
        self.causes.powered_down(node.pool)
        kept_since = self.time - POWERED_DOWN_KEPT_S
        for old in [n for n, (_, at) in self.powered_down.items() if at < kept_since]:
            del self.powered_down[old]
        self.powered_down[name] = (node.pool, self.time)
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
        pools = candidate_pools(
            self.pools.values(), pc.models, pc.fallback, spec.gpus, spec.memory_gib
        )
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
        since = job.waiting_since if job.waiting_since is not None else job.submitted_at
        waited = job.state == "queued" and self.time > since
        self.causes.started(job.priority_class, job.pools or (job.pool,), since if waited else None)
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
        self.causes.started_on_slices(job.priority_class, (g.uuid for g in gpus))
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
        self.restarts[job.priority_class or "-"] += 1
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
        self.causes.stopped("restarted", job.priority_class)
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
            Finished(
                job.priority_class,
                job.project,
                started - job.submitted_at,
                started - job.submitted_at + (job.duration_s or 0.0),
            )
        )
        self.counters["culled"] += 1
        self.causes.stopped("culled", job.priority_class)
        return self.release(job)

    def release(self, job: Job) -> list[str]:
        """Free the job's GPUs and drop it from the cluster; returns the freed uuids."""
        freed = self._unplace(job)
        if self.jobs.pop(job.id, None) is not None and job.served_s > 0:
            self.served_sessions.append(
                (job.priority_class, job.served_s, job.slowed_s, job.over_objective_s)
            )
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

    def set_arrival_rate(self, rate_per_min: float) -> float:
        """Change the background arrival rate; returns the previous one."""
        return self.stepper.set_arrival_rate(rate_per_min)

    def advance(self, dt: float) -> None:
        """Move simulated time by ``dt`` seconds: job progress (slower under clock locks),
        finished jobs, arrivals, ended grants, scheduling, readings, energy and its cost
        (``gpuops.sim.fleet.stepping``)."""
        self.stepper.advance(dt)

    # --- views (``gpuops.sim.fleet.readings``) -----------------------------------------------

    def gpu_readings(self, node_name: str) -> list[GpuReading]:
        return readings.gpu_readings(self, node_name)

    def fleet_reading(self) -> FleetReading:
        return readings.fleet_reading(self)

    def drainable(self) -> tuple[tuple[str, str, int], ...]:
        """(node, pool, 1 or 0) for every up node: 1 when ``consolidate`` would empty it now."""
        return readings.drainable(self)

    def state(self) -> dict[str, object]:
        """The document ``GET /api/v1/state`` returns."""
        return readings.state(self)
