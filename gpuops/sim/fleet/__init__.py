"""The simulated GPU fleet (``gpuops fleet sim``): nodes that export ``nvml_*`` series on their
own ports, jobs, per-pool queues, a scheduler and a JSON control API.

Entry point for in-process users (demo, tests): ``FleetSim(FleetConfig(...))``. See
``gpuops.sim.fleet.sim`` for the runtime and ``gpuops.sim.fleet.control`` for the API.
"""

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import GPU_MODELS, PROFILES, FleetConfig, JobSpec, PoolSpec
from gpuops.sim.fleet.errors import BadRequest, Conflict, FleetError, NotFound
from gpuops.sim.fleet.sd import (
    FLEET_JOB,
    NODES_JOB,
    prometheus_config,
    scrape_configs,
    scrape_jobs,
)
from gpuops.sim.fleet.sim import FleetSim

__all__ = [
    "FLEET_JOB",
    "GPU_MODELS",
    "NODES_JOB",
    "PROFILES",
    "BadRequest",
    "Cluster",
    "Conflict",
    "FleetConfig",
    "FleetError",
    "FleetSim",
    "JobSpec",
    "NotFound",
    "PoolSpec",
    "prometheus_config",
    "scrape_configs",
    "scrape_jobs",
]
