"""Settings of the simulated fleet: GPU models, pools, job specs and the fleet config.

Read by ``exporters.fleet.cluster`` (which builds the nodes and the initial workload from them)
and by ``exporters.fleet.sim`` (ports, files, tick). Everything here is a frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass

PROFILES = ("training", "notebook", "inference", "light")
"""Utilization profiles a job can have: training ~0.9, notebook ~0.02, inference bursty,
light ~0.25 (see ``exporters.fleet.model.profile_utilization``)."""


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


GIB = 1024**3

GPU_MODELS: dict[str, GpuModel] = {
    "A100": GpuModel("A100", "NVIDIA A100-SXM4-80GB", 80 * GIB, 210, 1410, 1593, 400.0, 55.0),
    "H100": GpuModel("H100", "NVIDIA H100 80GB HBM3", 80 * GIB, 345, 1980, 2619, 700.0, 70.0),
    "T4": GpuModel("T4", "Tesla T4", 16 * GIB, 300, 1590, 5001, 70.0, 10.0),
}
"""Known GPU models by short name (the ``model`` of a pool)."""


@dataclass(frozen=True)
class PoolSpec:
    """A pool of identical nodes."""

    name: str = "default"
    nodes: int = 4
    """Nodes at start; scale_out/scale_in change this at run time."""
    gpus_per_node: int = 4
    model: str = "A100"
    """A key of ``GPU_MODELS``."""


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
        for profile, _weight in self.job_mix:
            if profile not in PROFILES:
                raise ValueError(f"job_mix: unknown profile {profile!r}; use one of {PROFILES}")
        if self.arrival_rate_per_min < 0:
            raise ValueError("arrival_rate_per_min must be >= 0")
        if self.speed <= 0 or self.tick_s <= 0:
            raise ValueError("speed and tick_s must be > 0")


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
