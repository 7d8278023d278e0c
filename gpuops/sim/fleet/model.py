"""The mutable parts of the simulated fleet (GPUs, nodes, jobs) and how a GPU's readings move.

Owned by ``gpuops.sim.fleet.cluster``, which holds the one lock every change happens under;
nothing else mutates these objects. Collectors and the control API read copies.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuops.sim.fleet.config import GpuModel
from gpuops.sim.fleet.energy import power_watts, throughput

SESSION_PROFILES = ("notebook", "inference")
"""Profiles whose duration is wall-clock time (a user's session, a service's serving time),
not work: a lower clock or a shared GPU makes them slower to answer, not longer; what they
lose is still counted (``downclock_lost_gpu_s``, ``share_lost_gpu_s``). Stopped and started
again elsewhere, they lose no work (only the restart)."""

CULLED_PROFILES = ("notebook",)
"""Profiles a ``reclaim`` culls rather than requeues (``Cluster.cull``): an idle notebook's
server is stopped, as JupyterHub's idle culler (jupyterhub-idle-culler, ``--timeout``) and
Kubeflow's notebook culling (``CULL_IDLE_TIME``) do; its user opens a new session at their
next activity. Requeued at once instead, it would hold a GPU again at ~0 % (the waste the
reclaim was for). An inference service is requeued: its clients need it back."""

SESSION_IDLE_UTILIZATION = 0.05
"""A session's GPU load at or below this is idle (nobody uses the notebook or service)."""

SESSION_IDLE_S = 600.0
"""A notebook without checkpoints is moved (``consolidate``) only after this long idle: moved
while in use, its user would lose the open session. An inference service is moved in use,
as a Deployment's pod is evicted for a scale-down: its clients see the relaunch."""

_PROFILE_MEMORY = {"training": 0.85, "notebook": 0.30, "inference": 0.45, "light": 0.20}


def profile_utilization(profile: str, t: float, phase: float, rng: random.Random) -> float:
    """Utilization (0-1) of a GPU running a job of ``profile`` at simulated time ``t``.

    training ~0.9, notebook ~0.02 (idle but allocated), light ~0.25, inference bursty: a slow
    wave between ~0.05 and ~0.85 with noise. ``phase`` de-synchronises jobs.
    """
    if profile == "training":
        value = 0.9 + rng.uniform(-0.04, 0.04)
    elif profile == "notebook":
        value = 0.02 + rng.uniform(-0.015, 0.015)
    elif profile == "light":
        value = 0.25 + rng.uniform(-0.03, 0.03)
    else:  # inference
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * (t / 90.0) + phase)
        value = 0.05 + 0.8 * wave**2 + rng.uniform(-0.05, 0.05)
    return min(max(value, 0.0), 1.0)


def profile_memory_fraction(profile: str) -> float:
    """Typical share of GPU memory a job of ``profile`` holds."""
    return _PROFILE_MEMORY.get(profile, 0.5)


POWERED_DOWN_KEPT_S = 3600.0
"""How long a powered-down node is still exported as such: the console lists a node that
stopped reporting for an hour (``gpuops.api.fleetview.LOOKBACK``)."""


@dataclass
class Gpu:
    index: int
    uuid: str
    model: GpuModel
    pci_bus_id: str
    job: str | None = None
    """The job holding the whole GPU (exclusive); None when free or shared."""
    tenants: list[str] = field(default_factory=list)
    """Jobs on the slices of a shared GPU (``gpuops.sim.fleet.sharing``); empty otherwise."""
    utilization: float = 0.0
    memory_used: int = 0
    temperature: float = 32.0
    power: float = 0.0
    energy_joules: float = 0.0
    clock_locked_mhz: int | None = None

    def __post_init__(self) -> None:
        self.power = self.model.idle_power_watts

    @property
    def max_clock_mhz(self) -> int:
        return self.model.max_clock_mhz

    def graphics_clock_mhz(self) -> int:
        """Current graphics/SM clock: idles low, boosts with load, never above a lock."""
        m = self.model
        clock = m.min_clock_mhz + (m.max_clock_mhz - m.min_clock_mhz) * min(
            1.0, 0.15 + self.utilization * 1.2
        )
        if self.clock_locked_mhz is not None:
            clock = min(clock, self.clock_locked_mhz)
        return int(clock)

    def clock_limit_share(self) -> float:
        """The clock lock as a share of the maximum clock (1.0 when unlocked)."""
        if self.clock_locked_mhz is None:
            return 1.0
        return self.clock_locked_mhz / self.model.max_clock_mhz

    def step(
        self, dt: float, utilization: float, memory_fraction: float, profile: str = ""
    ) -> float:
        """Advance readings by ``dt`` simulated seconds towards the given load; returns the
        job's progress rate on this GPU (1.0 at full clock, less under a clock lock; see
        ``gpuops.sim.fleet.energy``)."""
        self.utilization = utilization
        self.memory_used = int(self.model.memory_bytes * memory_fraction)
        m = self.model
        clock_share = self.graphics_clock_mhz() / m.max_clock_mhz
        self.power = power_watts(m.idle_power_watts, m.power_limit_watts, utilization, clock_share)
        self.energy_joules += self.power * dt
        target_temp = 30.0 + 52.0 * utilization * clock_share
        alpha = min(1.0, dt / 20.0)
        self.temperature += (target_temp - self.temperature) * alpha
        return throughput(profile, self.clock_limit_share()) if profile else 1.0


@dataclass
class Node:
    name: str
    pool: str
    model: GpuModel
    gpus: list[Gpu]
    seq: int
    failed: bool = False
    drained: bool = False
    port: int | None = None
    booting_until: float | None = None
    """Simulated time a machine powered up by scale_out can run jobs from (None: it can)."""
    host_power: float = 0.0
    """What its host (all but its GPUs) draws now (``gpuops.sim.fleet.energy.host_power_watts``;
    set at every cluster step)."""
    host_idle_power: float = 0.0
    """Its host's draw at no load (the part of ``host_power`` any powered node pays)."""
    driver_version: str = ""
    """The NVIDIA driver it runs (``nvml_gpu_info``); a rollout's step changes it
    (``gpuops.sim.fleet.rollout``)."""

    @property
    def state(self) -> str:
        """up | failed | drained | booting, as ``gpuops_fleet_nodes{state}`` and the state
        API say."""
        if self.failed:
            return "failed"
        if self.booting_until is not None:
            return "booting"
        return "drained" if self.drained else "up"

    @property
    def schedulable(self) -> bool:
        return not self.failed and not self.drained and self.booting_until is None

    def free_gpus(self) -> list[Gpu]:
        return [g for g in self.gpus if g.job is None and not g.tenants]

    def job_ids(self) -> set[str]:
        """Every job on the node, exclusive or on a slice."""
        out = {g.job for g in self.gpus if g.job is not None}
        for g in self.gpus:
            out.update(g.tenants)
        return out

    def idle(self) -> bool:
        return all(g.job is None and not g.tenants for g in self.gpus)


@dataclass
class Job:
    id: str
    project: str
    profile: str
    gpus: int
    pool: str
    priority: int
    duration_s: float | None
    memory_fraction: float
    submitted_at: float
    phase: float
    state: str = "queued"
    """queued | running (finished and reclaimed jobs leave the cluster)."""
    node: str | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    remaining_s: float | None = None
    pools: tuple[str, ...] = ()
    """Pools the job may run in, preferred first (``pool`` is the first); its queue is
    ``pool``'s."""
    job_class: str = ""
    priority_class: str = ""
    memory_gib: float | None = None
    checkpoint_interval_s: float | None = None
    started_at: float | None = None
    """When it last started running (for the minimum runtime before a preemption)."""
    first_started_at: float | None = None
    since_checkpoint_s: float = 0.0
    """Work done since the last checkpoint, seconds at full speed."""
    preemptions: int = 0
    front: bool = False
    """Requeued after a preemption: placed before jobs of its priority that never ran."""
    queued_at: float | None = None
    """When a reclaim requeued it (it queues behind what waited then); None: its submit."""
    waiting_since: float | None = None
    """When it last entered the queue (submitted, preempted, requeued): how long it has
    waited this time (a power-up for it, ``Scheduler.demand``)."""
    borrowed: bool = False
    """Runs beyond its project's quota on GPUs it may lose to their owner."""
    lost_gpu_s: float = 0.0
    """GPU-seconds of work lost to preemptions (credited to its project)."""
    shareable: bool = False
    """It may run on slices of shared GPUs (its job class says so)."""
    shared: bool = False
    """It runs on one slice of each of its GPUs (``Gpu.tenants``), not on whole GPUs."""
    relaunch_s: float = 0.0
    """Relaunch time it owes when it next starts (``Cluster.restart_cost``)."""
    restarting_until: float | None = None
    """It relaunches until then: its GPUs are held but idle, it makes no progress."""
    redo_s: float = 0.0
    """Work (seconds) lost at its last restarts that it is still doing again."""
    busy_at: float | None = None
    """When its GPU load last exceeded ``SESSION_IDLE_UTILIZATION`` (None: not since it
    started); a session without checkpoints moves only when idle (``Scheduler.drain_plan``)."""
    served_s: float = 0.0
    """A session's seconds running (not relaunching): what its answer times are taken over."""
    slowed_s: float = 0.0
    """Those seconds, each times how much slower the session answered then than alone
    (1 / its rate under clock locks and sharing): ``slowed_s / served_s`` is its mean
    slowdown factor."""
    over_objective_s: float = 0.0
    """Seconds it answered slower than its job class's ``slowdown_objective``."""
    moved_at: float | None = None
    """When it was last stopped and started again (``Cluster.restart_cost``: packed onto
    another GPU, consolidated, reclaimed) or migrated off a node; None: never."""

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "project": self.project,
            "profile": self.profile,
            "gpus": self.gpus,
            "state": self.state,
            "node": self.node,
            "pool": self.pool,
            "priority": self.priority,
            "gpu_uuids": list(self.gpu_uuids),
            "duration_s": self.duration_s,
            "remaining_s": self.remaining_s,
            "job_class": self.job_class,
            "priority_class": self.priority_class,
            "preemptions": self.preemptions,
            "borrowed": self.borrowed,
            "lost_gpu_s": self.lost_gpu_s,
            "shared": self.shared,
        }


class Finished(NamedTuple):
    """A job that finished, or a notebook session ``cull`` ended: what the report's completion
    times and queue waits are made of (``Cluster.completed``, ``Cluster.culled_sessions``)."""

    priority_class: str
    project: str
    wait_s: float
    """Submit to first start."""
    jct_s: float
    """Submit to finish (a culled session: to the end its whole session would have had)."""


@dataclass(frozen=True)
class GpuReading:
    """What one GPU reports at one instant; a copy, safe to read without the cluster lock."""

    node: str
    pool: str
    index: int
    uuid: str
    name: str
    model: str
    pci_bus_id: str
    utilization: float
    memory_total_bytes: int
    memory_used_bytes: int
    power_watts: float
    power_limit_watts: float
    temperature_celsius: float
    energy_joules: float
    graphics_clock_mhz: int
    memory_clock_mhz: int
    max_graphics_clock_mhz: int
    max_memory_clock_mhz: int

    @classmethod
    def of(cls, node: Node, gpu: Gpu) -> GpuReading:
        m = gpu.model
        return cls(
            node=node.name,
            pool=node.pool,
            index=gpu.index,
            uuid=gpu.uuid,
            name=m.name,
            model=m.short,
            pci_bus_id=gpu.pci_bus_id,
            utilization=gpu.utilization,
            memory_total_bytes=m.memory_bytes,
            memory_used_bytes=gpu.memory_used,
            power_watts=gpu.power,
            power_limit_watts=m.power_limit_watts,
            temperature_celsius=gpu.temperature,
            energy_joules=gpu.energy_joules,
            graphics_clock_mhz=gpu.graphics_clock_mhz(),
            memory_clock_mhz=m.memory_clock_mhz,
            max_graphics_clock_mhz=m.max_clock_mhz,
            max_memory_clock_mhz=m.memory_clock_mhz,
        )


@dataclass(frozen=True)
class FleetReading:
    """The fleet-level series at one instant (see ``gpuops.sim.fleet.collectors``)."""

    allocations: tuple[tuple[str, str, str, str], ...]
    """(node, uuid, job, project) per GPU; job and project are "" on a free GPU."""
    queue: dict[str, int]
    nodes: dict[tuple[str, str], int]
    """(pool, state) -> node count, every state present for every pool."""
    running: dict[str, int]
    migrated: int
    reclaimed: int
    sharing: tuple[tuple[str, str, int], ...] = ()
    """(node, uuid, jobs on its slices) per GPU of a pool that can share (0: not shared),
    but for GPUs held whole by a job that is not shareable, too big for one of its slices
    (MIG), or on borrowed capacity where the fleet does not lend slices (``pack`` would
    refuse them; the downclock policy acts on them instead); 0 also for a GPU of a pool that
    cannot share held whole by a shareable job while ``Scheduler.pack_target`` has a slice
    of another of its pools for it now."""
    power_watts: dict[str, float] = field(default_factory=dict)
    """pool -> power drawn now by its GPUs."""
    energy_joules: dict[str, float] = field(default_factory=dict)
    """pool -> energy since start."""
    energy_cost: float = 0.0
    price_per_kwh: float = 0.0
    off_peak_price_per_kwh: float = 0.0
    period: str = "base"
    currency: str = "USD"
    class_queue: dict[str, int] = field(default_factory=dict)
    """priority class -> queued jobs (every declared class present)."""
    held: dict[str, bool] = field(default_factory=dict)
    """holdable priority class -> held now."""
    quotas: dict[tuple[str, str], int] = field(default_factory=dict)
    demand: dict[str, int] = field(default_factory=dict)
    """Queued jobs one more node of the pool could place (``Scheduler.demand``)."""
    project_gpus: dict[str, int] = field(default_factory=dict)
    """project -> GPUs its running jobs hold."""
    preemptions: dict[str, int] = field(default_factory=dict)
    credit_gpu_s: dict[str, float] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    """priority class ("" for none) -> finished jobs."""
    work_gpu_s: float = 0.0
    borrow_demand: dict[str, int] = field(default_factory=dict)
    """Queued jobs that idle GPUs reserved by other projects in the pool could place now."""
    lending: dict[str, bool] = field(default_factory=dict)
    """pool -> lends its idle reserved GPUs (``lend``)."""
    held_queue: dict[str, int] = field(default_factory=dict)
    """pool -> queued jobs of held priority classes (part of ``queue``): they wait for the
    hold to end, not for GPUs (Slurm's ``JobHeldAdmin`` reason)."""
    drainable: tuple[tuple[str, str, int], ...] = ()
    """(node, pool, 1 when ``consolidate`` would empty it now, else 0) per up node."""
    borrowed: tuple[tuple[str, str], ...] = ()
    """(node, uuid) of every GPU a job on borrowed capacity holds or shares (another
    project's idle reserved GPUs, lent, or free slices of its shared GPUs with
    ``slice_borrowing``): the owner reclaims them by preemption."""
    booting: tuple[tuple[str, str, int], ...] = ()
    """(node, pool, 1 while it boots, else 0) per node that has not failed: a power-down
    policy counts a node's idle time from when it can run jobs, not from its power-up."""
    powered_down: tuple[tuple[str, str], ...] = ()
    """(node, pool) of each node powered down in the last hour
    (``POWERED_DOWN_KEPT_S``)."""
