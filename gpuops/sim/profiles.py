"""The job classes' utilization profiles from a Prometheus holding the NVML exporter's series:
each class's GPUs' utilization over the history's window, the fleet file's profile
(``training``, ``inference``, ``light``, ``notebook``) nearest to it, and the GPU memory its
jobs used.

Called by ``gpuops fleet from-history --prometheus`` (``gpuops.cli.fleet``) before
``gpuops.sim.fromhistory.derive`` writes the file. What a job's GPUs did is
``nvml_gpu_utilization_ratio`` joined on (``node``, ``uuid``) to ``gpuops_gpu_allocated``, the
allocation series with the job's ``project`` and ``partition`` (the Slurm recording rule
writes it: deploy/prometheus/slurm/gpuops-slurm.rules.yml); a job class is a project and a
pool, as ``derive`` makes them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpuops.sim.history import HistoryError
from gpuops.sources.errors import QueryError
from gpuops.sources.prometheus import PrometheusClient


def _held(metric: str) -> str:
    """``metric`` of each GPU while a job holds it, with the job's labels: one series per job
    and GPU (a GPU shared by two jobs is in both)."""
    return (
        f"max by (node, uuid) ({metric}) * on (node, uuid) group_right "
        "max by (node, uuid, job, project, partition) (gpuops_gpu_allocated == 1)"
    )


HELD = _held("nvml_gpu_utilization_ratio")
MEMORY = _held("nvml_gpu_memory_used_bytes")
GIB = 1024**3

CHUNK_S = 86_400.0
"""The window is read a day at a time: one query's subquery stays a day's points long."""

INFERENCE_SWING = 0.15
"""A class whose GPUs' utilization moves over time by this much (the mean of each job's
standard deviation over time, 0-1) or more is a service's: the fleet's ``inference`` profile
swings by about 0.27, the steady profiles by 0.03 at most."""

TRAINING_FROM = 0.575
LIGHT_FROM = 0.135
"""Steady classes take the profile whose level is nearest their mean: ``training`` (~0.9)
from the midpoint to ``light`` (~0.25), ``light`` from its midpoint to ``notebook`` (~0.02)."""


@dataclass
class _Sums:
    n: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    peak: float = 0.0
    """The most GPU memory (bytes) the job used on the GPU; 0: not reported."""

    def add(self, n: float, total: float, squares: float, peak: float) -> None:
        self.n += n
        self.total += total
        self.squares += squares
        self.peak = max(self.peak, peak)

    def swing(self) -> float | None:
        if self.n < 2:
            return None
        mean = self.total / self.n
        return math.sqrt(max(self.squares / self.n - mean * mean, 0.0))


@dataclass(frozen=True)
class Measured:
    """One job class's utilization over the window, and the profile it takes."""

    mean: float
    """Over every sample of its jobs' GPUs (a GPU-hour weighs as much as any other)."""
    swing: float
    """The mean over its jobs' GPUs of their utilization's standard deviation over time."""
    gpu_hours: float
    """GPU-hours of samples seen."""
    profile: str
    memory_gib: float | None = None
    """The median over its jobs' GPUs of the most memory the job used on each (None: the
    exporter reported none): what the fleet file's ``memory_gib`` says of every job of the
    class, as the case study's median footprint does."""


def profile_of(mean: float, swing: float) -> str:
    """The fleet file's profile for a class whose GPUs ran at ``mean`` moving by ``swing``."""
    if swing >= INFERENCE_SWING:
        return "inference"
    if mean >= TRAINING_FROM:
        return "training"
    return "light" if mean >= LIGHT_FROM else "notebook"


Row = tuple[Mapping[str, str], float, float, float, float]
"""A job-GPU series' labels, and over a part of the window its utilization's samples, sum and
sum of squares, and its memory's peak (bytes; 0: none reported)."""


def classes_of(
    rows: Iterable[Row], pools: Sequence[str], step_s: float
) -> dict[tuple[str, str], Measured]:
    """(project, pool) -> ``Measured`` from the job-GPU series' ``Row``s. With one pool every
    series is its; otherwise a series' ``partition`` names it."""
    per_series: dict[tuple[str, ...], _Sums] = defaultdict(_Sums)
    for labels, n, total, squares, peak in rows:
        pool = pools[0] if len(pools) == 1 else labels.get("partition", "")
        if pool not in pools:
            continue
        key = (labels.get("project", ""), pool, labels.get("job", ""), labels.get("uuid", ""))
        per_series[key].add(n, total, squares, peak)
    by_class: dict[tuple[str, str], list[_Sums]] = defaultdict(list)
    for (project, pool, *_), sums in per_series.items():
        by_class[(project, pool)].append(sums)
    out: dict[tuple[str, str], Measured] = {}
    for cls, series in by_class.items():
        n = sum(s.n for s in series)
        if n == 0:
            continue
        swings = [w for s in series if (w := s.swing()) is not None]
        mean = sum(s.total for s in series) / n
        swing = sum(swings) / len(swings) if swings else 0.0
        peaks = [s.peak / GIB for s in series if s.peak > 0]
        memory = round(statistics.median(peaks), 1) if peaks else None
        out[cls] = Measured(mean, swing, n * step_s / 3600.0, profile_of(mean, swing), memory)
    return out


def measure(
    url: str, start: float, end: float, pools: Sequence[str], timeout_s: float = 60.0
) -> dict[tuple[str, str], Measured]:
    """The job classes' utilization from the Prometheus at ``url`` over [``start``, ``end``]
    (Unix seconds), a day at a time; ``HistoryError`` naming ``--prometheus`` when it cannot
    be read or holds no series of the window."""
    if not url.startswith(("http://", "https://")):
        raise HistoryError(f"--prometheus {url!r}: not a URL; use http://HOST:PORT")
    client = PrometheusClient(url, timeout_s=timeout_s)
    step = min(60, max(1, round((end - start) / 1000)))  # whole seconds: PromQL's durations
    rows: list[Row] = []
    at = start
    try:
        while at < end:
            stop = min(end, at + CHUNK_S)
            window = f"[{max(math.ceil(stop - at), step)}s:{step}s]"
            sums: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(lambda: [0.0] * 4)
            for i, expr in enumerate(
                (
                    f"count_over_time(({HELD}){window})",
                    f"sum_over_time(({HELD}){window})",
                    f"sum_over_time((({HELD}) ^ 2){window})",
                    f"max_over_time(({MEMORY}){window})",
                )
            ):
                for sample in client.query(expr, at=stop):
                    sums[tuple(sorted(sample.labels.items()))][i] = sample.value
            rows += [(dict(k), n, total, sq, peak) for k, (n, total, sq, peak) in sums.items()]
            at = stop
    except QueryError as exc:
        raise HistoryError(f"--prometheus {url}: {exc}") from None
    if not rows:
        first, last = (datetime.fromtimestamp(t, UTC).isoformat() for t in (start, end))
        raise HistoryError(
            f"--prometheus {url}: no GPU held by a job from {first} to {last} (the history's "
            "window): nvml_gpu_utilization_ratio joined on (node, uuid) to gpuops_gpu_allocated "
            "== 1 has no series; the NVML exporter's series and the allocation series "
            "(deploy/prometheus/slurm/gpuops-slurm.rules.yml) must both be kept that long"
        )
    return classes_of(rows, pools, step)
