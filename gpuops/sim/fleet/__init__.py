"""The simulated GPU fleet (``gpuops fleet sim``): nodes that export ``nvml_*`` series on their
own ports, jobs, per-pool queues, a scheduler and a JSON control API.

Entry point for in-process users (demo, tests): ``FleetSim(FleetConfig(...))``. See
``gpuops.sim.fleet.sim`` for the runtime and ``gpuops.sim.fleet.control`` for the API.

From the top (the layers contract in pyproject.toml): the runtimes (``sim`` in wall time,
``virtual`` in virtual time for the what-if); what a run achieved (``report``); the control
API, the collectors, file_sd and remote write; the operations the API offers; the cluster
(``cluster``) and the fleet files that configure it (``fleetfile``); the cluster's readings
and its simulated time (``readings``, ``stepping``); the scheduler (``scheduler``) and its
parts (``consolidation``, ``grants``, ``slices``, ``preemption``, ``quotas``); the mutable
parts of the fleet (``model``); and its values (``workload``, ``config``, ``energy``,
``errors``, ``sharing``).
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
