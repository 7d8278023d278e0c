"""Fleet simulator speed: how fast the cluster steps a 512-GPU fleet through 24
simulated hours with the scheduler (classes, affinity, quotas, borrowing, preemption), the
energy model and arrivals, and what one scheduling pass costs with a long queue. Prints
figures; never fails on noise.

Run: ``python -m tests.benchmarks.bench_fleet``. The fleet is the Helios-calibrated example
(examples/fleets/helios-earth.yaml) scaled 4x: 64 nodes of 8 V100, arrival rates x4. The
what-if target is 24 virtual hours of a 500-GPU fleet in <= 10 minutes on 2 cores; the
simulator's share of that budget is what this measures (no HTTP, no Prometheus).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import FleetConfig, JobSpec, PoolSpec, ProjectSpec
from gpuops.sim.fleet.fleetfile import load_fleet

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleets" / "helios-earth.yaml"
STEP_S = 15.0
"""Simulated seconds per step: Prometheus' usual scrape interval."""


def scaled(config: FleetConfig, factor: int) -> FleetConfig:
    pools = tuple(replace(p, nodes=p.nodes * factor) for p in config.pools)
    projects = tuple(
        ProjectSpec(p.name, tuple((pool, n * factor) for pool, n in p.reserved))
        for p in config.reservations
    )
    classes = tuple(replace(c, rate_per_hour=c.rate_per_hour * factor) for c in config.job_classes)
    return replace(config, pools=pools, reservations=projects, job_classes=classes)


def day(config: FleetConfig) -> None:
    cluster = Cluster(config)
    gpus = sum(len(n.gpus) for n in cluster.nodes.values())
    started = time.perf_counter()
    cpu = time.process_time()
    steps = 0
    alloc = 0.0
    while cluster.time < 86400.0:
        cluster.advance(STEP_S)
        steps += 1
        alloc += sum(g.job is not None for n in cluster.nodes.values() for g in n.gpus) / gpus
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    print(f"fleet: {config.name} x4, {gpus} GPUs, {len(cluster.nodes)} nodes")
    print(f"24 h at {STEP_S:.0f} s steps: {steps} steps in {wall:.1f} s wall, {cpu:.1f} s CPU")
    print(f"per step: {wall / steps * 1000:.2f} ms; simulated/real speed: {86400 / wall:,.0f}x")
    print(
        f"jobs finished: {len(cluster.completed)}, queued at the end: "
        f"{sum(len(q) for q in cluster.queues.values())}, preemptions: "
        f"{sum(cluster.scheduler.preemptions.values())}, mean allocation: {alloc / steps:.1%}"
    )


def long_queue() -> None:
    config = FleetConfig(
        pools=(PoolSpec("a", 64, 8, "V100"),),
        arrival_rate_per_min=0.0,
        initial_jobs=(),
        priority_classes=scaled(load_fleet(FLEET), 1).priority_classes,
    )
    cluster = Cluster(config)
    for i in range(2000):  # the fleet fills up, then 2000 - 512 stay queued
        cluster.submit(
            JobSpec("training", 1 + i % 8 // 7 * 7, f"p{i % 5}", pool="", duration_s=1e6)
        )
    queued = sum(len(q) for q in cluster.queues.values())
    repeat = 50
    started = time.perf_counter()
    for _ in range(repeat):
        cluster.schedule()
    per_pass = (time.perf_counter() - started) / repeat * 1000
    print(f"scheduling pass with {queued} queued jobs on a full 512-GPU fleet: {per_pass:.2f} ms")


if __name__ == "__main__":
    day(scaled(load_fleet(FLEET), 4))
    long_queue()
