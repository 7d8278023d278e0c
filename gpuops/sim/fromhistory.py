"""A fleet file derived from a cluster's job history (``gpuops.sim.history``), and how closely
the fleet's policies-off run reproduces that history over the same window (the calibration).

Called by ``gpuops fleet from-history`` (``gpuops.cli.fleet``). The history gives the
workload: projects (accounts), job classes per project and pool (arrival rate, the seconds
in which many jobs were submitted at once as bursts, GPU counts, log-normal durations); the
pools' models and sizes are the site's to state (``--pool``): accounting records the jobs,
not the machines. The derived file is checked by the fleet file loader like any other.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from gpuops.sim.fleet.config import GPU_MODELS, FleetConfig
from gpuops.sim.fleet.fleetfile import parse_fleet
from gpuops.sim.fleet.report import Recorder
from gpuops.sim.fleet.virtual import VirtualFleet
from gpuops.sim.history import HistoryError, JobRecord
from gpuops.sim.profiles import Measured, measure

BURST_JOBS = 5
"""Jobs of one class submitted within the same second from which they are a burst (a sweep,
an array, a deadline), kept as such: spread as Poisson arrivals over the window they would
wait far less than they did."""

TOLERANCE_ALLOCATION = 0.05
"""The off run's allocation ratio may differ from the history's by this much (absolute): the
same jobs' GPU-seconds over the same GPUs, within the difference of drawing them again."""
TOLERANCE_WAIT_S = 15.0
TOLERANCE_WAIT = 0.5
"""The off run's mean queue wait may differ from the history's by ``TOLERANCE_WAIT_S`` or by
this share of it, whichever is larger: the model draws the durations again and has none of
the scheduler's own latency (Slurm's main loop and backfill pass run every few seconds to
30 s), so waits match in size, not to the second."""


@dataclass(frozen=True)
class PoolShape:
    """What accounting does not record: a partition's GPU model, nodes and GPUs per node."""

    name: str
    model: str
    nodes: int
    gpus_per_node: int


_POOL = re.compile(r"^([^=]+)=([A-Za-z0-9]+):(\d+)x(\d+)$")


def parse_pool(text: str) -> PoolShape:
    """``PARTITION=MODEL:NODESxGPUS``, e.g. ``gpu=A100:16x8``."""
    match = _POOL.match(text.strip())
    if match is None:
        raise HistoryError(f"--pool {text!r}: use PARTITION=MODEL:NODESxGPUS, e.g. gpu=A100:16x8")
    name, model, nodes, gpus = match.groups()
    if model not in GPU_MODELS:
        raise HistoryError(
            f"--pool {text!r}: model {model!r} is unknown; use one of {', '.join(GPU_MODELS)}"
        )
    if int(nodes) < 1 or not 1 <= int(gpus) <= 16:
        raise HistoryError(f"--pool {text!r}: nodes must be >= 1 and GPUs per node 1-16")
    return PoolShape(name, model, int(nodes), int(gpus))


@dataclass(frozen=True)
class Observed:
    """The figures the calibration compares, from the history or from the off run."""

    allocation: float | None
    """GPU-seconds held over GPU-seconds there were, over the window."""
    wait_mean_s: float | None
    jct_mean_s: float | None
    """Submit to end, over the jobs that ended in the window."""
    jobs: int
    """Jobs that ended in the window."""


def window(records: Sequence[JobRecord]) -> tuple[float, float]:
    """From the first submission to the last end (or submission)."""
    t0 = min(r.submit for r in records)
    t1 = max(max(r.end or r.submit, r.submit) for r in records)
    return t0, max(t1, t0 + 1.0)


def observed(records: Sequence[JobRecord], pools: Sequence[PoolShape]) -> Observed:
    """The history's own figures over its window."""
    t0, t1 = window(records)
    gpus = sum(p.nodes * p.gpus_per_node for p in pools)
    held = sum(
        r.gpus * max(0.0, min(r.end, t1) - max(r.start, t0))
        for r in records
        if r.start is not None and r.end is not None
    )
    waits = [w for r in records if (w := r.wait_s) is not None]
    jcts = [r.end - r.submit for r in records if r.end is not None and r.start is not None]
    return Observed(
        held / (gpus * (t1 - t0)) if gpus else None,
        statistics.fmean(waits) if waits else None,
        statistics.fmean(jcts) if jcts else None,
        len(jcts),
    )


def _hour(at: float) -> float:
    t = datetime.fromtimestamp(at, UTC)
    return t.hour + t.minute / 60 + t.second / 3600


def _durations(runs: list[float]) -> dict[str, float]:
    """A log-normal with the spread of the run times' logarithms and the history's mean run
    time (its median ``mean * exp(-sigma^2 / 2)``): the GPU-seconds the jobs hold, which the
    allocation measures, are the history's even where run times are far from log-normal
    (whole seconds of short jobs); at most the longest run."""
    runs = [max(r, 1.0) for r in runs] or [3600.0]
    logs = [math.log(r) for r in runs]
    sigma = statistics.pstdev(logs) if len(logs) > 1 else 0.0
    median = statistics.fmean(runs) * math.exp(-(sigma**2) / 2)
    return {"median": round(median, 3), "sigma": round(sigma, 3), "max": max(runs)}


def measured_profiles(
    url: str, records: Sequence[JobRecord], pools: Sequence[PoolShape]
) -> dict[tuple[str, str], Measured]:
    """The job classes' utilization over the history's window from the Prometheus at ``url``
    (``gpuops.sim.profiles``); ``HistoryError`` when its series name none of the history's
    projects and pools."""
    t0, t1 = window(records)
    measured = measure(url, t0, t1, [p.name for p in pools])
    wanted = {(r.project, r.pool) for r in records}
    if not wanted & set(measured):
        found = ", ".join(sorted(f"{p}/{q}" for p, q in measured)) or "none"
        raise HistoryError(
            f"--prometheus {url}: its jobs' GPUs are of projects/partitions {found}, none of "
            f"the history's ({', '.join(sorted(f'{p}/{q}' for p, q in wanted))}): the "
            "allocation series' project and partition labels must be the accounts and "
            "partitions of the history"
        )
    return measured


def profile_table(measured: Mapping[tuple[str, str], Measured], doc: Mapping[str, Any]) -> str:
    """Each job class's measured utilization and memory, and the profile it took."""
    lines = [f"  {'job class':<24}{'GPU-hours':>10}{'mean':>8}{'swing':>8}{'memory':>10}   profile"]
    for jc in doc["job_classes"]:
        m = measured.get((jc["project"], jc["priority_class"]))
        if m is None:
            lines.append(
                f"  {jc['name']:<24}{'-':>10}{'-':>8}{'-':>8}{'-':>10}   training (no series)"
            )
        else:
            memory = "-" if m.memory_gib is None else f"{m.memory_gib:g} GiB"
            lines.append(
                f"  {jc['name']:<24}{m.gpu_hours:>10.1f}{m.mean:>8.1%}{m.swing:>8.1%}"
                f"{memory:>10}   {m.profile}"
            )
    return "\n".join(lines)


def derive(
    records: Sequence[JobRecord],
    pools: Sequence[PoolShape],
    name: str,
    source: str,
    measured: Mapping[tuple[str, str], Measured] | None = None,
) -> dict[str, Any]:
    """The fleet file (as data) whose workload is the history's: one job class per project
    and pool, its rate over the span of the submissions; bursts for the seconds in which a
    class submitted ``BURST_JOBS`` or more, or any when the whole history was submitted within
    one second (when the history spans under a day: a burst recurs daily), Poisson arrivals
    for the rest; the profile and memory ``measured`` gives the class
    (from Prometheus: ``measured_profiles``), else ``training`` and the profile's memory."""
    measured = measured or {}
    if not records:
        raise HistoryError(f"{source}: no job with GPUs in the history")
    shapes = {p.name: p for p in pools}
    missing = sorted({r.pool for r in records} - set(shapes))
    if missing:
        raise HistoryError(
            f"{source}: jobs ran in {', '.join(missing)}; describe each with "
            "--pool PARTITION=MODEL:NODESxGPUS"
        )
    t0, t1 = window(records)
    hours = (t1 - t0) / 3600.0
    submitted_h = max(max(r.submit for r in records) - t0, 1.0) / 3600.0
    # every job submitted within one second: no span to take a rate over, each class a burst
    at_once = max(int(r.submit) for r in records) == int(t0)
    classes: dict[tuple[str, str], list[JobRecord]] = defaultdict(list)
    for r in records:
        classes[(r.project, r.pool)].append(r)
    job_classes = []
    for (project, pool), jobs in sorted(classes.items()):
        too_big = [r.job_id for r in jobs if r.gpus > shapes[pool].gpus_per_node * r.nodes]
        if too_big:
            raise HistoryError(
                f"{source}: jobs {', '.join(too_big[:5])} hold more GPUs than --pool "
                f"{pool} gives their nodes"
            )
        per_second = Counter(int(r.submit) for r in jobs)
        in_burst = (
            {s for s, n in per_second.items() if n >= BURST_JOBS or at_once}
            if hours < 24
            else set()
        )
        spread = [r for r in jobs if int(r.submit) not in in_burst]
        m = measured.get((project, pool))
        job_classes.append(
            {
                "name": f"{project}-{pool}",
                "project": project,
                "priority_class": pool,
                "profile": m.profile if m else "training",
                "rate_per_hour": round(len(spread) / submitted_h, 4),
                "bursts": [
                    {"hour": round(_hour(s), 6) % 24, "jobs": per_second[s]}
                    for s in sorted(in_burst)
                ],
                "gpus": {g: n for g, n in sorted(Counter(r.gpus for r in jobs).items())},
                "duration": _durations([run for j in jobs if (run := j.run_s) is not None]),
            }
        )
        if m is not None and m.memory_gib is not None:
            job_classes[-1]["memory_gib"] = m.memory_gib
    first, last = (datetime.fromtimestamp(t, UTC).isoformat() for t in (t0, t1))
    calibration = f"{source}: {len(records)} jobs submitted from {first} to {last}"
    if measured:
        calibration += "; utilization profiles from the GPUs' series over that window: " + (
            ", ".join(
                f"{p}-{q} {m.mean:.0%} mean, {m.swing:.0%} swing: {m.profile}"
                for (p, q), m in sorted(measured.items())
                if (p, q) in classes
            )
        )
    return {
        "name": name,
        "description": f"derived by gpuops fleet from-history from {len(records)} GPU jobs",
        "calibration": calibration,
        "seed": 42,
        # a second before the first submission: a burst at the very start still fires
        "start_hour": round(_hour(t0 - 1.0), 6) % 24,
        "pools": [
            {"name": p.name, "model": p.model, "nodes": p.nodes, "gpus_per_node": p.gpus_per_node}
            for p in pools
        ],
        "projects": [{"name": p} for p in sorted({r.project for r in records})],
        "priority_classes": [
            {"name": p.name, "priority": 0, "models": [p.model], "fallback": False} for p in pools
        ],
        "job_classes": job_classes,
        "scheduler": {"borrowing": True, "preemption": False},
        "initial_jobs": [],
    }


def fleet_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=100)


def simulate(config: FleetConfig, seconds: float) -> Observed:
    """The fleet's policies-off run over ``seconds``, stepped finely enough for the shortest
    windows (a thousandth of the window, at most the what-if's 15 s)."""
    step = min(15.0, max(seconds / 1000.0, 0.01))
    recorder = Recorder()
    virtual = VirtualFleet(
        config, 0, None, step, step_s=step, recorder=recorder, record_interval_s=step
    )
    virtual.run_until(seconds)
    report = recorder.report(virtual.cluster)
    return Observed(
        report.allocation_ratio,
        report.wait_mean_s,
        report.jct_completed_mean_s,
        report.jobs_completed,
    )


@dataclass(frozen=True)
class Calibration:
    history: Observed
    model: Observed

    def allocation_ok(self) -> bool:
        a, b = self.history.allocation, self.model.allocation
        return a is not None and b is not None and abs(a - b) <= TOLERANCE_ALLOCATION

    def wait_ok(self) -> bool:
        a, b = self.history.wait_mean_s, self.model.wait_mean_s
        if a is None or b is None:
            return False
        return abs(a - b) <= max(TOLERANCE_WAIT_S, TOLERANCE_WAIT * a)

    def table(self) -> str:
        h, m = self.history, self.model

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:.1%}"

        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f} s"

        def verdict(ok: bool) -> str:
            return "within" if ok else "OUTSIDE"

        rows = [
            ("", "history", "model (off)", "tolerance"),
            (
                "allocation",
                pct(h.allocation),
                pct(m.allocation),
                f"{verdict(self.allocation_ok())} ±{TOLERANCE_ALLOCATION * 100:g} pt",
            ),
            (
                "queue wait mean",
                secs(h.wait_mean_s),
                secs(m.wait_mean_s),
                f"{verdict(self.wait_ok())} ±max({TOLERANCE_WAIT_S:g} s, {TOLERANCE_WAIT:.0%})",
            ),
            ("JCT mean (ended jobs)", secs(h.jct_mean_s), secs(m.jct_mean_s), "shown"),
            ("jobs ended", str(h.jobs), str(m.jobs), "shown"),
        ]
        return "\n".join(f"  {a:<24}{b:>12}{c:>14}   {d}" for a, b, c, d in rows)


def calibrate(
    records: Sequence[JobRecord], pools: Sequence[PoolShape], doc: dict[str, Any], source: str
) -> tuple[FleetConfig, Calibration]:
    """Load the derived file as the loader would (a problem is a bug here, named so), run it
    policies off over the history's window, and compare."""
    config = parse_fleet(fleet_yaml(doc), f"{source} (derived fleet)")
    t0, t1 = window(records)
    return config, Calibration(observed(records, pools), simulate(config, t1 - t0 + 1.0))
