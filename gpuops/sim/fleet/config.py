"""Settings of the simulated fleet: GPU models, pools, job specs and the fleet config.

Read by ``gpuops.sim.fleet.cluster`` (which builds the nodes and the initial workload from them)
and by ``gpuops.sim.fleet.sim`` (ports, files, tick). Everything here is a frozen value.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuops.sim.fleet.energy import Tariff

if TYPE_CHECKING:
    from gpuops.sim.fleet.workload import JobClass, PriorityClass

PROFILES = ("training", "notebook", "inference", "light")
"""Utilization profiles a job can have: training ~0.9, notebook ~0.02, inference bursty,
light ~0.25 (see ``gpuops.sim.fleet.model.profile_utilization``)."""


@dataclass(frozen=True)
class GpuModel:
    """What a GPU of one model reports: the same figures NVML gives for the real part."""

    short: str
    name: str
    memory_bytes: int
    min_clock_mhz: int
    max_clock_mhz: int
    memory_clock_mhz: int
    power_limit_watts: float
    idle_power_watts: float
    speed: float = 1.0
    """Compute-bound work per second relative to an A100 (job durations are A100 time)."""
    fp16_tflops: float = 312.0
    """Peak dense FP16 Tensor Core TFLOPS (NVIDIA's datasheets: A100 312, H100 SXM 989, V100
    SXM2 125, T4 65, RTX A6000 154.8): what the report weighs a GPU-hour of each model by
    (utilization weighted by throughput: a busy T4-hour is a fifth of a busy A100-hour)."""


GIB = 1024**3

GPU_MODELS: dict[str, GpuModel] = {
    "A100": GpuModel(
        "A100", "NVIDIA A100-SXM4-80GB", 80 * GIB, 210, 1410, 1593, 400.0, 55.0, fp16_tflops=312.0
    ),
    "H100": GpuModel(
        "H100",
        "NVIDIA H100 80GB HBM3",
        80 * GIB,
        345,
        1980,
        2619,
        700.0,
        70.0,
        speed=2.0,
        fp16_tflops=989.0,
    ),
    "V100": GpuModel(
        "V100", "Tesla V100-SXM2-32GB", 32 * GIB, 135, 1530, 877, 300.0, 40.0, fp16_tflops=125.0
    ),
    "T4": GpuModel("T4", "Tesla T4", 16 * GIB, 300, 1590, 5001, 70.0, 10.0, fp16_tflops=65.0),
    "RTXA6000": GpuModel(
        "RTXA6000", "NVIDIA RTX A6000", 48 * GIB, 210, 1800, 8001, 300.0, 22.0, fp16_tflops=154.8
    ),
}
"""Known GPU models by short name (the ``model`` of a pool). Memory, maximum SM clock, memory
clock and board power are NVIDIA's datasheet figures (A100 SXM4 80GB: 400 W, 1410 MHz; H100
SXM5: 700 W, 1980 MHz; V100 SXM2 32GB: 300 W, 1530 MHz; T4: 70 W, 1590 MHz; RTX A6000: 48 GB,
300 W, 1800 MHz) as ``nvidia-smi -q`` reports them; the minimum clock is the lowest supported
application clock; idle power is a typical ``nvidia-smi`` reading at P0 with no process.

``speed``: training throughput per GPU relative to the A100, which job durations are measured
on. H100 SXM: 2.0, the low end of what MLPerf Training v3.0 (2023) results show per GPU against
A100 (about 2-3x on BERT, ResNet-50, GPT-3, without counting FP8's further gain). The other
models stay at 1.0: in the shipped fleets only light, inference and notebook work runs on
them (not compute-bound, or wall-clock sessions), and their durations are their own."""


@dataclass(frozen=True)
class PoolSpec:
    """A pool of identical nodes."""

    name: str = "default"
    nodes: int = 4
    """Nodes at start; scale_out/scale_in change this at run time."""
    gpus_per_node: int = 4
    model: str = "A100"
    """A key of ``GPU_MODELS``."""
    cloud: bool = False
    """An idle/cloud pool: nodes are added by scale_out (or a quota grant) and removed when
    idle; its GPUs count towards power only while they exist."""
    max_nodes: int | None = None
    """Most nodes scale_out may bring the pool to (the machines a physical pool has, powered
    up again after a scale_in; a cloud pool's limit); None: no limit, and the machines a
    power-up brings back for the queue are the most nodes the pool has had
    (``Cluster.machines``). Quota grants are not capped by it."""
    sharing: str | None = None
    """How a GPU of the pool can be shared by several jobs once a ``pack`` makes it shared:
    ``mig`` (A100/H100: isolated slices, each ``1/slices`` of the SMs and memory) or
    ``time-slicing`` (any model: the jobs take turns; see ``gpuops.sim.fleet.sharing``);
    None: one job per GPU."""
    slices: int = 1
    """Jobs one shared GPU can hold (MIG instances, or time-slicing replicas)."""
    boot_s: float = 0.0
    """Seconds a machine powered up by scale_out takes before it can run jobs (it draws idle
    power meanwhile), a cloud pool's too; 0: at once. A quota grant's nodes are there at once."""
    host_idle_watts: float = 0.0
    """What one node's host (CPUs, memory, NICs, NVSwitch, fans, PSU losses: all but its GPUs)
    draws whenever the node is on, booting included (``gpuops.sim.fleet.energy``); 0: hosts not
    modelled (the GPUs' power only)."""
    host_peak_watts: float = 0.0
    """The host's draw at full load (its GPUs at 100 %); linear in between. At or below
    ``host_idle_watts`` (the default 0 included): a constant draw."""
    price_per_gpu_hour: float = 0.0
    """What one GPU-hour of the pool costs while powered, in the tariff's currency, besides
    its energy (a cloud pool's rental price); 0: owned, its cost not counted."""


@dataclass(frozen=True)
class JobSpec:
    """A job to submit: used for the initial workload and by the control API."""

    profile: str = "training"
    gpus: int = 1
    project: str = "research"
    pool: str = "default"
    duration_s: float | None = None
    """Simulated seconds the job runs once placed; None runs until reclaimed."""
    priority: int = 0
    """Higher runs first when the queue is drained."""
    memory_fraction: float | None = None
    """Share of each GPU's memory the job uses; None takes the profile's typical share."""
    node: str | None = None
    """Place on this node (and only there)."""
    gpu_uuids: tuple[str, ...] = ()
    """Place on exactly these GPUs (all on one node)."""
    job_class: str = ""
    """The fleet file's job class it came from ("" for jobs submitted by hand)."""
    priority_class: str = ""
    """A key of ``FleetConfig.priority_classes``; "" keeps plain ``priority`` ordering."""
    memory_gib: float | None = None
    """Memory each GPU must have; smaller models cannot take the job."""
    checkpoint_interval_s: float | None = None
    """Work lost on preemption is at most this; None: a preempted job starts over."""
    shareable: bool = False
    """The job may run on a slice of a shared GPU (``pack``, and the scheduler's placement on
    free slices)."""


@dataclass(frozen=True)
class ProjectSpec:
    """A project (team) and the GPUs reserved for it, per pool."""

    name: str
    reserved: tuple[tuple[str, int], ...] = ()
    """(pool, GPUs) guaranteed to the project: its jobs there are never preempted for quota,
    and other projects' jobs on those GPUs are borrowing, reclaimed when the owner needs them."""


@dataclass(frozen=True)
class SchedulerSettings:
    """How the scheduler shares GPUs between projects and classes."""

    borrowing: bool = True
    """Jobs beyond their project's quota may use idle GPUs reserved by others (and are
    preempted when the owner needs them). False: reserved GPUs stay idle for their owner."""
    slice_borrowing: bool = False
    """Other projects' shareable jobs may run on free slices of a project's shared GPUs, as
    borrowed capacity: the owner preempts them when it needs the GPUs back (as it does
    borrowed whole GPUs). It matters only once ``pack`` has shared GPUs (no GPU is shared
    without it); ``borrowing`` and ``lend`` are for whole GPUs."""
    preemption: bool = True
    min_runtime_s: float = 600.0
    """A job runs at least this long after (re)starting before it can be preempted again."""
    max_preemptions: int = 3
    """A job preempted this often is never preempted again."""
    restart_s: float = 300.0
    """What a job stopped and started again (reclaimed, packed onto another GPU) pays on top of
    the work lost since its last checkpoint: relaunch, reloading data and model (seconds)."""
    move_interval_s: float = 3600.0
    """A job moved by ``consolidate`` is not moved again for this long (no ping-pong)."""


@dataclass(frozen=True)
class HarmLimits:
    """What a policy may cost before ``gpuops whatif`` flags it (a fleet file's
    ``harm_limits``, or ``--harm-limit``; docs/whatif.md, "Harm limits")."""

    jct_increase: float = 0.10
    """A priority class's mean completion time may be at most this share longer with the
    policies than without: a tenth is a delay a class's users notice, and above the day-to-day
    noise of a class's mean on the shipped fleets' seeds only for the larger classes."""
    over_objective: float = 0.05
    """A class's sessions may spend at most this share of their time answering slower than
    their job class's ``slowdown_objective`` (and no more than without the policies): a 95 %
    objective, as a serving SLO is usually written."""
    non_preemptible_stops: int = 0
    """Jobs of a priority class marked ``preemptible: false`` that one policy may stop (cull,
    restart elsewhere, preempt off GPUs it lent): none, since the fleet file says they must
    not be stopped."""
    completed_decrease: float = 0.10
    """A priority class may complete at most this share fewer jobs with the policies than
    without (and never two or more fewer past it): the mean completion time counts only the
    jobs that end, so a class whose jobs are held or never start is seen here."""


@dataclass(frozen=True)
class FleetConfig:
    """The whole simulated fleet. The no-argument default is sized for ``gpuops demo``."""

    pools: tuple[PoolSpec, ...] = (PoolSpec(),)
    """Pools and their nodes; node names run node-0, node-1, ... across pools in order."""
    seed: int = 42
    """Seeds every random choice (uuids, arrivals, utilization noise): same seed, same fleet."""
    arrival_rate_per_min: float = 0.5
    """Mean background job arrivals per simulated minute (Poisson); 0 stops arrivals."""
    job_mix: tuple[tuple[str, float], ...] = (
        ("training", 0.5),
        ("inference", 0.2),
        ("notebook", 0.15),
        ("light", 0.15),
    )
    """Profile weights of background arrivals."""
    job_gpus: tuple[int, ...] = (1, 1, 1, 2, 4)
    """GPU counts background arrivals draw from (capped at a node's GPU count)."""
    job_duration_s: tuple[float, float] = (120.0, 600.0)
    """Uniform range of background job durations, simulated seconds."""
    projects: tuple[str, ...] = ("vision", "nlp", "recsys", "research")
    """Projects background arrivals draw from."""
    initial_jobs: tuple[JobSpec, ...] | None = None
    """Jobs placed at start; None takes ``default_workload``: every node but the last runs one
    training job on all its GPUs, the last node holds a notebook (idle but allocated), a light
    job (~0.25) and an inference job, and one GPU stays free. The queue starts empty."""
    speed: float = 1.0
    """Simulated seconds per real second."""
    tick_s: float = 0.25
    """Real seconds between simulation steps."""
    driver_version: str = "550.54.15"
    """Reported in ``nvml_gpu_info``."""
    host: str = "127.0.0.1"
    """Address every listener binds."""
    control_port: int = 0
    """Port of the control API and fleet /metrics; 0 takes a free port."""
    first_node_port: int = 0
    """Node n listens on first_node_port + n; 0 takes free ports (kept across fail/restore)."""
    sd_file: str | None = None
    """Prometheus file_sd JSON file to keep current; None writes one in a temporary directory."""
    advertise_host: str | None = None
    """Host written into file_sd targets; None uses ``host``."""
    name: str = "default"
    """Name of the fleet (a fleet file's ``name``)."""
    reservations: tuple[ProjectSpec, ...] = ()
    """Projects with reserved GPUs (a fleet file's ``projects``)."""
    priority_classes: tuple[PriorityClass, ...] = ()
    job_classes: tuple[JobClass, ...] = ()
    """Arrivals by class; when given they replace the background arrivals above."""
    scheduler: SchedulerSettings = SchedulerSettings()
    tariff: Tariff = Tariff()
    harm_limits: HarmLimits = HarmLimits()
    """What a policy may cost before the what-if flags it."""
    start_hour: float = 0.0
    """Local hour of day at simulated time 0 (for the tariff and diurnal arrivals)."""

    @classmethod
    def single_pool(
        cls,
        nodes: int = 4,
        gpus_per_node: int = 4,
        pool: str = "default",
        model: str = "A100",
        **kwargs: object,
    ) -> FleetConfig:
        """The common case: one pool of identical nodes."""
        spec = PoolSpec(name=pool, nodes=nodes, gpus_per_node=gpus_per_node, model=model)
        return cls(pools=(spec,), **kwargs)  # type: ignore[arg-type]

    def validate(self) -> None:
        """Raise ValueError naming the field when the config cannot run."""
        if not self.pools:
            raise ValueError("pools: at least one pool is needed")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools: duplicate pool names in {names}")
        for p in self.pools:
            if p.model not in GPU_MODELS:
                raise ValueError(
                    f"pools[{p.name}].model: {p.model!r} is unknown; use one of "
                    f"{', '.join(sorted(GPU_MODELS))}"
                )
            if p.nodes < 0 or p.gpus_per_node < 1:
                raise ValueError(f"pools[{p.name}]: nodes must be >= 0 and gpus_per_node >= 1")
            problem = sharing_problem(p.sharing, p.slices, p.model)
            if problem:
                raise ValueError(f"pools[{p.name}].sharing: {problem}")
        for profile, _weight in self.job_mix:
            if profile not in PROFILES:
                raise ValueError(f"job_mix: unknown profile {profile!r}; use one of {PROFILES}")
        if self.arrival_rate_per_min < 0:
            raise ValueError("arrival_rate_per_min must be >= 0")
        if self.speed <= 0 or self.tick_s <= 0:
            raise ValueError("speed and tick_s must be > 0")
        classes = {c.name for c in self.priority_classes}
        for jc in self.job_classes:
            if jc.priority_class not in classes:
                raise ValueError(
                    f"job_classes[{jc.name}].priority_class: {jc.priority_class!r} is not one of "
                    f"{sorted(classes)}"
                )
        pools = set(names)
        for project in self.reservations:
            for pool, _gpus in project.reserved:
                if pool not in pools:
                    raise ValueError(f"projects[{project.name}].reserved: no pool {pool!r}")


def candidate_pools(
    pools: Iterable[PoolSpec],
    models: tuple[str, ...],
    fallback: bool,
    gpus: int,
    memory_gib: float | None,
) -> tuple[str, ...]:
    """Pools a job may run in, best first: its class's preferred ``models`` in their order
    (owned pools before cloud ones), then, with ``fallback``, the others, largest memory
    first; only pools whose nodes have ``gpus`` GPUs and whose GPUs have ``memory_gib``.
    Empty when none can take it: the cluster refuses such a job and the fleet file's checks
    refuse a job class that draws one."""
    fits = [
        p
        for p in pools
        if p.model in GPU_MODELS
        and p.gpus_per_node >= gpus
        and (memory_gib is None or GPU_MODELS[p.model].memory_bytes >= memory_gib * GIB)
    ]
    rank = {m: i for i, m in enumerate(models)}
    preferred = [p for p in fits if not models or p.model in rank]
    preferred.sort(key=lambda p: (rank.get(p.model, 0), p.cloud))
    rest = [p for p in fits if p not in preferred] if fallback else []
    rest.sort(key=lambda p: (p.cloud, -GPU_MODELS[p.model].memory_bytes))
    return tuple(p.name for p in preferred + rest)


SHARING_MODES = ("mig", "time-slicing")
MIG_MODELS = ("A100", "H100")
"""Models with Multi-Instance GPU (NVIDIA's MIG user guide: A100, H100; up to 7 instances)."""


def sharing_problem(mode: str | None, slices: int, model: str) -> str:
    """What is wrong with a pool's sharing settings ("" when nothing)."""
    if mode is None:
        return "" if slices == 1 else f"slices {slices} needs a sharing mode"
    if mode not in SHARING_MODES:
        return f"{mode!r} is not a sharing mode; use one of {', '.join(SHARING_MODES)}"
    if mode == "mig" and model not in MIG_MODELS:
        return f"mig needs one of {', '.join(MIG_MODELS)}; {model} has no MIG (use time-slicing)"
    top = 7 if mode == "mig" else 16
    if not 2 <= slices <= top:
        return f"slices must be within [2, {top}] for {mode}, got {slices}"
    return ""


def default_workload(config: FleetConfig) -> tuple[JobSpec, ...]:
    """The initial jobs described on ``FleetConfig.initial_jobs``, per pool."""
    jobs: list[JobSpec] = []
    index = 0
    for pool in config.pools:
        names = [f"node-{index + i}" for i in range(pool.nodes)]
        index += pool.nodes
        if not names:
            continue
        g = pool.gpus_per_node
        for name in names[:-1]:
            jobs.append(JobSpec("training", g, "vision", pool.name, node=name))
        last = names[-1]
        mixed = ["notebook", "light", "inference"][: max(g - 1, 1)]
        projects = {"notebook": "research", "light": "recsys", "inference": "nlp"}
        for profile in mixed:
            jobs.append(JobSpec(profile, 1, projects[profile], pool.name, node=last))
        rest = g - len(mixed) - 1
        if rest > 0:
            jobs.append(JobSpec("training", rest, "nlp", pool.name, node=last))
    return tuple(jobs)
