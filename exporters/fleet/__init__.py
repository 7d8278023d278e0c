"""The simulated GPU fleet (``gpuops fleet sim``): nodes that export ``nvml_*`` series on their
own ports, jobs, per-pool queues, a scheduler and a JSON control API.

Entry point for in-process users (demo, tests): ``FleetSim(FleetConfig(...))``. See
``exporters.fleet.sim`` for the runtime and ``exporters.fleet.control`` for the API.
"""

from exporters.fleet.cluster import Cluster
from exporters.fleet.config import GPU_MODELS, PROFILES, FleetConfig, JobSpec, PoolSpec
from exporters.fleet.errors import BadRequest, Conflict, FleetError, NotFound
from exporters.fleet.sd import (
    FLEET_JOB,
    NODES_JOB,
    prometheus_config,
    scrape_configs,
    scrape_jobs,
)
from exporters.fleet.sim import FleetSim

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
