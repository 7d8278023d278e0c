"""A validated fleet file made into the ``FleetConfig`` the cluster runs.

Called by ``gpuops.sim.fleet.fleetfile.load`` once the schema and the checks across sections
have passed; ``with_listeners`` sets what the command line adds (listeners, a seed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuops.sim.fleet.config import (
    FleetConfig,
    HarmLimits,
    JobSpec,
    PoolSpec,
    ProjectSpec,
    SchedulerSettings,
)
from gpuops.sim.fleet.energy import Tariff, TariffPeriod
from gpuops.sim.fleet.fleetfile.schema import _FleetFile, _Host
from gpuops.sim.fleet.workload import Burst, JobClass, PriorityClass


def _host_peak(host: _Host | None) -> float:
    if host is None:
        return 0.0
    return host.idle_watts if host.peak_watts is None else host.peak_watts


def config(doc: _FleetFile) -> FleetConfig:
    first_pool = doc.pools[0].name
    initial = None
    if doc.initial_jobs is not None:
        initial = tuple(
            JobSpec(
                profile=j.profile,
                gpus=j.gpus,
                project=j.project,
                pool=j.pool or first_pool,
                duration_s=j.duration,
                node=j.node,
                priority_class=j.priority_class,
            )
            for j in doc.initial_jobs
        )
    config = FleetConfig(
        pools=tuple(
            PoolSpec(
                p.name,
                p.nodes,
                p.gpus_per_node,
                p.model,
                p.cloud,
                p.max_nodes,
                p.sharing.mode if p.sharing else None,
                p.sharing.slices if p.sharing else 1,
                p.boot,
                host_idle_watts=p.host.idle_watts if p.host else 0.0,
                host_peak_watts=_host_peak(p.host),
                price_per_gpu_hour=p.price_per_gpu_hour,
            )
            for p in doc.pools
        ),
        seed=doc.seed,
        name=doc.name,
        start_hour=doc.start_hour,
        arrival_rate_per_min=doc.arrival_rate_per_min if not doc.job_classes else 0.0,
        initial_jobs=initial if initial is not None else (() if doc.job_classes else None),
        reservations=tuple(
            ProjectSpec(p.name, tuple(sorted(p.reserved.items()))) for p in doc.projects
        ),
        priority_classes=tuple(
            PriorityClass(
                c.name,
                c.priority,
                tuple(c.models),
                c.fallback,
                c.preemptible,
                c.preempts,
                c.holdable,
            )
            for c in doc.priority_classes
        ),
        job_classes=tuple(
            JobClass(
                name=c.name,
                project=c.project,
                priority_class=c.priority_class,
                profile=c.profile,
                rate_per_hour=c.rate_per_hour,
                diurnal=tuple(c.diurnal),
                bursts=tuple(Burst(b.hour, b.jobs) for b in c.bursts),
                gpus=tuple(sorted(c.gpus.items())),
                duration_median_s=c.duration.median,
                duration_sigma=c.duration.sigma,
                duration_max_s=c.duration.max,
                memory_gib=c.memory_gib,
                checkpoint_interval_s=c.checkpoint_interval,
                shareable=c.shareable,
                slowdown_objective=c.slowdown_objective,
            )
            for c in doc.job_classes
        ),
        scheduler=SchedulerSettings(
            doc.scheduler.borrowing,
            doc.scheduler.slice_borrowing,
            doc.scheduler.preemption,
            doc.scheduler.min_runtime,
            doc.scheduler.max_preemptions,
            doc.scheduler.restart,
            doc.scheduler.move_interval,
        ),
        tariff=Tariff(
            doc.tariff.base_price_per_kwh,
            tuple(
                TariffPeriod(p.start_hour, p.end_hour, p.price_per_kwh, p.name)
                for p in doc.tariff.periods
            ),
            doc.tariff.currency,
        ),
        harm_limits=HarmLimits(
            doc.harm_limits.jct_increase,
            doc.harm_limits.over_objective,
            doc.harm_limits.non_preemptible_stops,
            doc.harm_limits.completed_decrease,
        ),
    )
    return config


def with_listeners(config: FleetConfig, **listeners: Any) -> FleetConfig:
    """The fleet file's config with the listener settings of the command line."""
    return replace(config, **listeners)
