"""Simulated time: what one step of the cluster does — arrivals, job progress (slower under
clock locks and on shared GPUs), finished jobs, ended grants, scheduling, the GPUs' readings,
energy and its cost.

Owned by ``gpuops.sim.fleet.cluster`` (``Cluster.advance``, ``Cluster.set_arrival_rate``),
whose lock it takes; ``gpuops.sim.fleet.sim`` advances it from a background thread and
``gpuops.sim.fleet.virtual`` in virtual time. Its totals (work, losses, energy) are the
cluster's, read by ``gpuops.sim.fleet.report``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from gpuops.sim.fleet.config import JobSpec
from gpuops.sim.fleet.energy import JOULES_PER_KWH, host_power_watts, throughput
from gpuops.sim.fleet.errors import BadRequest
from gpuops.sim.fleet.model import (
    SESSION_IDLE_UTILIZATION,
    SESSION_PROFILES,
    Finished,
    Gpu,
    Job,
    profile_utilization,
)
from gpuops.sim.fleet.sharing import gpu_utilization, progress_rates

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster

log = logging.getLogger(__name__)


class Stepper:
    """Moves one cluster through simulated time; keeps what one step hands the next."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._next_arrival = math.inf
        self._rates: dict[str, float] = {}
        """job -> its progress rate in the last step (clock locks and sharing)."""
        self._clock_rates: dict[str, float] = {}
        """job -> the clock lock's part of that rate."""
        self._active: dict[str, float] = {}
        """job -> the part of the last step it ran (the rest it relaunched); absent: all."""
        self._redo: dict[str, float] = {}
        """job -> the part of its last step's progress that was work done again."""
        self._objective_of: dict[str, float] | None = None
        """job class -> its ``slowdown_objective`` (made at the first use)."""

    def reset_arrivals(self) -> None:
        c = self.cluster
        rate = c.arrival_rate_per_min / 60.0 if c.arrivals is None else 0.0
        self._next_arrival = c.time + c.rng.expovariate(rate) if rate > 0 else math.inf

    def set_arrival_rate(self, rate_per_min: float) -> float:
        """Change the background arrival rate; returns the previous one."""
        c = self.cluster
        if not (rate_per_min >= 0 and math.isfinite(rate_per_min)):
            raise BadRequest(f"rate_per_min must be a finite number >= 0, got {rate_per_min}")
        with c.lock:
            previous = c.arrival_rate_per_min
            c.arrival_rate_per_min = rate_per_min
            self.reset_arrivals()
            if c.arrivals is not None:  # a fleet file's classes: scale them to that total
                base = sum(jc.rate_per_hour for jc in c.config.job_classes) / 60.0
                c.arrivals.rescale(rate_per_min / base if base > 0 else 0.0, c.time)
            return previous

    def _random_job(self) -> JobSpec:
        c = self.cluster
        cfg = c.config
        pool = c.rng.choice(sorted(c.pools))
        profiles = [p for p, _ in cfg.job_mix]
        weights = [w for _, w in cfg.job_mix]
        profile = c.rng.choices(profiles, weights)[0]
        gpus = min(c.rng.choice(cfg.job_gpus), c.pools[pool].gpus_per_node)
        low, high = cfg.job_duration_s
        return JobSpec(
            profile=profile,
            gpus=gpus,
            project=c.rng.choice(cfg.projects),
            pool=pool,
            duration_s=c.rng.uniform(low, high),
        )

    def advance(self, dt: float) -> None:
        """Move simulated time by ``dt`` seconds: job progress (slower under clock locks),
        finished jobs, arrivals, ended grants, scheduling, readings, energy and its cost."""
        c = self.cluster
        with c.lock:
            c.time += dt
            for booting in c.nodes.values():
                if booting.booting_until is not None and booting.booting_until <= c.time:
                    booting.booting_until = None
            for job in list(c.jobs.values()):
                node = c.nodes.get(job.node or "")
                if job.state != "running" or job.remaining_s is None or node is None:
                    continue
                if node.failed:
                    continue
                ran = dt
                if job.restarting_until is not None:  # relaunching for part of the step
                    ran = min(max(c.time - job.restarting_until, 0.0), dt)
                    self._active[job.id] = ran / dt if dt > 0 else 0.0
                    if job.restarting_until <= c.time:
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
                    c.release(job)
            if c.arrivals is not None:
                for _at, jc in c.arrivals.due(c.time):
                    c.submit(c.arrivals.spec(jc, c.priority_class(jc.priority_class)))
            else:
                while self._next_arrival <= c.time:
                    c.submit(self._random_job())
                    self._next_arrival += c.rng.expovariate(c.arrival_rate_per_min / 60.0)
            expired = bool(c.scheduler.grants) and bool(c.scheduler.expire())
            c.schedule()
            self._step_gpus(dt)
        if expired:
            c.notify_topology()

    def _finished(self, job: Job) -> None:
        c = self.cluster
        started = job.first_started_at if job.first_started_at is not None else c.time
        c.completed_gpu_s += (job.duration_s or 0.0) * job.gpus
        c.completed.append(
            Finished(
                job.priority_class,
                job.project,
                started - job.submitted_at,
                c.time - job.submitted_at,
            )
        )

    def _step_gpus(self, dt: float) -> None:
        c = self.cluster
        rates: dict[str, float] = {}
        joules = 0.0
        price = c.price_per_kwh()
        for node in c.nodes.values():
            if node.failed:
                continue
            before = 0.0
            for gpu in node.gpus:
                before += gpu.energy_joules
                if gpu.tenants:
                    self._step_shared(node.pool, gpu, dt, rates)
                    continue
                holder = c.jobs.get(gpu.job or "")
                if holder is None:
                    gpu.step(dt, 0.0, 0.0)
                    continue
                util = profile_utilization(holder.profile, c.time, holder.phase, c.rng)
                util *= self._active.get(holder.id, 1.0)
                if util > SESSION_IDLE_UTILIZATION:
                    holder.busy_at = c.time
                c.redo_busy_gpu_s += util * dt * self._redo.get(holder.id, 0.0)
                rate = gpu.step(dt, util, holder.memory_fraction, holder.profile)
                rates[holder.id] = min(rate, rates.get(holder.id, 1.0))
            drawn = sum(g.energy_joules for g in node.gpus) - before
            spec = c.pools[node.pool]
            load = sum(g.utilization for g in node.gpus) / len(node.gpus)
            node.host_power = host_power_watts(spec.host_idle_watts, spec.host_peak_watts, load)
            drawn += node.host_power * dt
            c.energy_joules[node.pool] += drawn
            joules += drawn
        for job_id, rate in rates.items():
            job = c.jobs[job_id]
            if job.profile in SESSION_PROFILES:
                self._serve(job, dt * self._active.get(job_id, 1.0), rate)
            speed = c.nodes[str(job.node)].model.speed
            # in A100-equivalent GPUs, for the part of the step it ran (not relaunching)
            gpus = job.gpus * speed * self._active.get(job_id, 1.0)
            clock = self._clock_rates.get(job_id, rate)
            c.work_gpu_s += dt * rate * gpus
            # the clock lock's share of the loss, then what sharing took on top of it
            c.downclock_lost_gpu_s += dt * (1.0 - clock) * gpus
            c.share_lost_gpu_s += dt * (clock - rate) * gpus
        self._rates = rates
        self._clock_rates = {}
        self._active = {}
        self._redo = {}
        c.energy_cost += joules / JOULES_PER_KWH * price

    def _serve(self, job: Job, seconds: float, rate: float) -> None:
        """A session answered for ``seconds`` at ``rate`` of its own GPU's speed: its
        slowdown (``Job.slowed_s``) and its time over its class's objective."""
        if seconds <= 0:
            return
        slowdown = 1.0 / rate if rate > 0 else math.inf
        job.served_s += seconds
        job.slowed_s += seconds * min(slowdown, 1e6)
        objective = self._objectives().get(job.job_class)
        if objective is not None and slowdown > objective + 1e-9:
            job.over_objective_s += seconds

    def _objectives(self) -> dict[str, float]:
        if self._objective_of is None:
            self._objective_of = {
                jc.name: jc.slowdown_objective
                for jc in self.cluster.config.job_classes
                if jc.slowdown_objective is not None
            }
        return self._objective_of

    def _step_shared(self, pool: str, gpu: Gpu, dt: float, rates: dict[str, float]) -> None:
        """One step of a shared GPU: its jobs' demands, the GPU's load, each job's progress
        (``gpuops.sim.fleet.sharing``) under the GPU's clock lock."""
        c = self.cluster
        spec = c.pools[pool]
        mode = spec.sharing or "time-slicing"
        tenants = [c.jobs[j] for j in gpu.tenants]
        demands = [
            profile_utilization(j.profile, c.time, j.phase, c.rng) * self._active.get(j.id, 1.0)
            for j in tenants
        ]  # a relaunching tenant asks nothing of the GPU
        for job, demand in zip(tenants, demands, strict=True):
            if demand > SESSION_IDLE_UTILIZATION:
                job.busy_at = c.time
        used = sum(c.job_bytes(j, gpu) for j in tenants)
        fraction = min(used / gpu.model.memory_bytes, 1.0)
        load = gpu_utilization(mode, demands, spec.slices)
        total = sum(demands)
        if total > 0:  # each tenant's part of the load, the redone part of it
            for job, demand in zip(tenants, demands, strict=True):
                c.redo_busy_gpu_s += load * dt * demand / total * self._redo.get(job.id, 0.0)
        gpu.step(dt, load, fraction)
        share = gpu.clock_limit_share()
        for job, rate in zip(tenants, progress_rates(mode, demands, spec.slices), strict=True):
            clock = throughput(job.profile, share)
            rates[job.id] = min(rate * clock, rates.get(job.id, 1.0))
            self._clock_rates[job.id] = min(clock, self._clock_rates.get(job.id, 1.0))
