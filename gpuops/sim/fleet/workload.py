"""The workload of a fleet file: priority classes, job classes and their arrival process.

Declared in a fleet file (``gpuops.sim.fleet.fleetfile``) and held by ``FleetConfig``; the
cluster (``gpuops.sim.fleet.cluster``) asks ``Arrivals`` for the jobs due up to a simulated
instant and places them with ``gpuops.sim.fleet.scheduler``. Frozen values and seeded draws;
the same seed gives the same workload on every run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpuops.sim.fleet.config import JobSpec


@dataclass(frozen=True)
class PriorityClass:
    """How the scheduler treats a class of jobs (Kubernetes' PriorityClass, Slurm's QOS)."""

    name: str
    priority: int
    """Higher is placed first."""
    models: tuple[str, ...] = ()
    """GPU models preferred, best first; empty: any model."""
    fallback: bool = True
    """When no preferred model fits, any other model with enough memory will do."""
    preemptible: bool = True
    """Jobs of this class can be preempted by higher classes."""
    preempts: bool = False
    """Jobs of this class preempt lower preemptible classes when they cannot be placed."""
    holdable: bool = False
    """The ``hold`` verb (off-peak policy) keeps queued jobs of this class from starting."""


@dataclass(frozen=True)
class Burst:
    """``jobs`` extra submissions every day at ``hour`` (a deadline, a sweep)."""

    hour: float
    jobs: int


@dataclass(frozen=True)
class JobClass:
    """A kind of job a project submits: how often, how big, how long, how busy."""

    name: str
    project: str
    priority_class: str
    profile: str = "training"
    rate_per_hour: float = 1.0
    """Mean arrivals per hour over a day (the diurnal shape moves it around this mean)."""
    diurnal: tuple[float, ...] = ()
    """24 relative weights, one per hour of the day (normalised to mean 1); empty: flat."""
    bursts: tuple[Burst, ...] = ()
    gpus: tuple[tuple[int, float], ...] = ((1, 1.0),)
    """(GPU count, weight) pairs."""
    duration_median_s: float = 3600.0
    duration_sigma: float = 1.0
    """Log-normal spread of durations (the heavy tail of Helios and Philly)."""
    duration_max_s: float = 7 * 86400.0
    memory_gib: float | None = None
    """GPU memory each GPU of the job needs; models with less cannot take it."""
    checkpoint_interval_s: float | None = None
    """A preempted job loses the work since its last checkpoint; None: it starts over."""
    shareable: bool = False
    """Its jobs may run on slices of shared GPUs (light analysis, inference, notebooks)."""
    slowdown_objective: float | None = None
    """A session's (notebook, inference) answers may be at most this many times slower than
    on a GPU of its own at full clock (e.g. 1.25); the report gives the share of its time
    over it. None: no objective."""

    def mean_rate_per_s(self) -> float:
        return self.rate_per_hour / 3600.0


def diurnal_weight(weights: tuple[float, ...], hour_of_day: float) -> float:
    """The relative arrival rate at ``hour_of_day`` (mean 1 over the day)."""
    if not weights:
        return 1.0
    mean = sum(weights) / len(weights)
    return weights[int(hour_of_day) % 24] / mean if mean > 0 else 0.0


class Arrivals:
    """Seeded arrivals of every job class: a non-homogeneous Poisson process per class
    (thinning against its peak rate) plus the daily bursts.

    Every class draws from random streams of its own (arrival instants; sizes and
    durations), so the workload is the same however finely the caller steps time and whatever
    the scheduler or the policies do: the what-if's two runs get the same jobs."""

    def __init__(self, classes: tuple[JobClass, ...], seed: int, start_hour: float) -> None:
        self.classes = classes
        self.start_hour = start_hour
        self._gaps = [random.Random(f"{seed}-arrivals-{jc.name}") for jc in classes]
        self._sizes = {jc.name: random.Random(f"{seed}-jobs-{jc.name}") for jc in classes}
        self.scale = 1.0
        """Multiplies every rate (``POST /api/v1/arrivals`` with a fleet file's classes)."""
        self._next: list[float] = []
        self._peaks: list[float] = []
        self._bursts: dict[tuple[int, int], float] = {}  # next instant of (class, burst)
        for i, jc in enumerate(classes):
            peak = max(diurnal_weight(jc.diurnal, h) for h in range(24))
            self._peaks.append(jc.mean_rate_per_s() * peak)
            self._next.append(self._draw_gap(i, 0.0))
            for b, burst in enumerate(jc.bursts):
                at = (burst.hour - start_hour) % 24.0 * 3600.0
                self._bursts[(i, b)] = at if at > 0 else 86400.0

    def hour_of_day(self, t: float) -> float:
        return (self.start_hour + t / 3600.0) % 24.0

    def _draw_gap(self, index: int, t: float) -> float:
        rate = self._peaks[index] * self.scale
        return t + self._gaps[index].expovariate(rate) if rate > 0 else math.inf

    def rescale(self, scale: float, now: float) -> None:
        self.scale = scale
        self._next = [self._draw_gap(i, now) for i in range(len(self.classes))]

    def due(self, until: float) -> list[tuple[float, JobClass]]:
        """Arrivals in (last call, ``until``], in time order: (instant, class)."""
        out: list[tuple[float, JobClass]] = []
        for i, jc in enumerate(self.classes):
            peak = self._peaks[i] * self.scale
            while self._next[i] <= until:
                t = self._next[i]
                weight = diurnal_weight(jc.diurnal, self.hour_of_day(t))
                keep = jc.mean_rate_per_s() * weight * self.scale / peak if peak > 0 else 0.0
                if self._gaps[i].random() < keep:
                    out.append((t, jc))
                self._next[i] = self._draw_gap(i, t)
            for b, burst in enumerate(jc.bursts):
                while self._bursts[(i, b)] <= until:
                    out.extend((self._bursts[(i, b)], jc) for _ in range(burst.jobs))
                    self._bursts[(i, b)] += 86400.0
        out.sort(key=lambda a: a[0])
        return out

    def spec(self, jc: JobClass, priority: PriorityClass) -> JobSpec:
        """Draw one job of class ``jc``: its GPU count and duration."""
        rng = self._sizes[jc.name]
        counts = [g for g, _ in jc.gpus]
        weights = [w for _, w in jc.gpus]
        gpus = rng.choices(counts, weights)[0]
        duration = min(
            jc.duration_max_s,
            jc.duration_median_s * math.exp(rng.gauss(0.0, jc.duration_sigma)),
        )
        return JobSpec(
            profile=jc.profile,
            gpus=gpus,
            project=jc.project,
            pool="",
            duration_s=max(duration, 1.0),
            priority=priority.priority,
            job_class=jc.name,
            priority_class=priority.name,
            memory_gib=jc.memory_gib,
            checkpoint_interval_s=jc.checkpoint_interval_s,
            shareable=jc.shareable,
        )
