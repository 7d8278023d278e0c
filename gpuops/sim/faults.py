"""Hardware faults and application XID floods for the simulated fleet, drawn from published
failure rates: a purely computational model that nothing here acts on.

``draw_faults`` draws a fleet's hardware faults over a horizon as a Poisson process per GPU at a
published rate times ``scale`` (the what-if states it: at the published rates a 128-GPU fleet
sees well under one fault in three days). Each fault has a category, an XID code from the
catalogue, a GPU and what fixes it: a GPU reset, a reboot or nothing (a human replaces the
part). ``FaultState`` keeps the open faults and answers the remediation ladder's steps the way a
node does: ``reset_gpu`` and ``reboot`` heal what they heal, ``validate`` passes only a node
with no open fault. ``app_flood`` is one crashed job's application XID on every node it ran on.

Rates (docs/health.md, "Faults in the simulated fleet"):

- Llama 3: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs, about 30 % of them a
  faulty GPU and 17 % HBM3 memory (Llama Team, "The Llama 3 Herd of Models", 2024, section
  3.3.4, Table 5).
- Meta RSC: a mean time between failures of about 47 days per 8-GPU node (Kokolis et al.,
  "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", 2024).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from gpuops.model.health.catalogue import XidCatalogue
from gpuops.model.health.faults import XidEvent
from gpuops.sim.fleet.cluster import Cluster

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S

LLAMA3_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
"""Unexpected interruptions per GPU-hour in Llama 3 405B's pre-training."""
RSC_PER_GPU_HOUR = 1 / (47 * 24 * 8)
"""Failures per GPU-hour on Meta's RSC clusters (one per 8-GPU node every 47 days)."""

RATE_BASES: dict[str, float] = {"llama3": LLAMA3_PER_GPU_HOUR, "rsc": RSC_PER_GPU_HOUR}


class Fix(StrEnum):
    """What heals a fault: the least step of the ladder that does."""

    RESET = "reset"
    """A GPU reset (or a reboot, which covers one)."""
    REBOOT = "reboot"
    """A reboot of the node."""
    REPLACE = "replace"
    """Nothing the ladder does: a human replaces the part."""


@dataclass(frozen=True)
class Category:
    """A kind of fault: its share of interruptions, the XID codes it raises and what fixes it
    (weights)."""

    name: str
    share: float
    codes: tuple[int, ...]
    fixes: tuple[tuple[Fix, float], ...]


CATEGORIES: tuple[Category, ...] = (
    Category("faulty_gpu", 0.226, (79,), ((Fix.REBOOT, 0.6), (Fix.REPLACE, 0.4))),
    Category(
        "faulty_gpu_nvlink", 0.075, (74,), ((Fix.RESET, 0.7), (Fix.REBOOT, 0.2), (Fix.REPLACE, 0.1))
    ),
    Category(
        "hbm3", 0.172, (48, 95, 64), ((Fix.RESET, 0.6), (Fix.REBOOT, 0.1), (Fix.REPLACE, 0.3))
    ),
    Category("gpu_sram", 0.045, (140,), ((Fix.RESET, 0.7), (Fix.REPLACE, 0.3))),
    Category("gsp", 0.041, (119, 120), ((Fix.RESET, 0.5), (Fix.REBOOT, 0.5))),
)
"""The GPU faults of Llama 3's interruptions that raise an XID (55.9 %): faulty GPU 30.1 %
(three quarters drawn as a GPU fallen off the bus, one quarter as an NVLink error: a split of
ours, the paper gives none), HBM3 17.2 %, GPU SRAM 4.5 %, the GPU system processor 4.1 %. The
other GPU causes (silent data corruption 1.4 %, thermal interface and sensor 1.4 %) raise no
XID, and the rest (software, host maintenance, network switches and cables, NICs) are not the
GPU's: none of them is drawn."""


@dataclass(frozen=True)
class InjectedFault:
    """One hardware fault: raised at ``at`` on ``gpu`` of ``node`` with XID ``code``."""

    at: float
    node: str
    gpu: str
    category: str
    code: int
    fix: Fix

    def event(self) -> XidEvent:
        return XidEvent(self.node, self.gpu, self.code, self.at)


@dataclass(frozen=True)
class FaultRates:
    """Faults per GPU-hour: ``base`` (a key of ``RATE_BASES``) times ``scale``."""

    scale: float
    base: str = "llama3"

    def __post_init__(self) -> None:
        if self.base not in RATE_BASES:
            raise ValueError(f"faults: base {self.base!r} is not one of {', '.join(RATE_BASES)}")
        if self.scale < 0:
            raise ValueError(f"faults: scale {self.scale} is negative")

    @property
    def per_gpu_hour(self) -> float:
        return RATE_BASES[self.base] * self.scale

    def expected(self, gpus: int, horizon_s: float) -> float:
        """The expected number of faults on ``gpus`` GPUs within ``horizon_s`` seconds."""
        return self.per_gpu_hour * sum(c.share for c in CATEGORIES) * gpus * horizon_s / HOUR_S


T = TypeVar("T")


def _weighted(rng: random.Random, choices: Sequence[tuple[T, float]]) -> T:
    return rng.choices([c for c, _ in choices], weights=[w for _, w in choices])[0]


def draw_faults(
    rates: FaultRates,
    gpus: Sequence[tuple[str, str]],
    start: float,
    horizon_s: float,
    catalogue: XidCatalogue,
    rng: random.Random,
) -> list[InjectedFault]:
    """The faults on ``gpus`` ((node, GPU UUID) pairs) from ``start`` for ``horizon_s`` seconds,
    in time order. A code the catalogue does not know is an error in the model, not a draw."""
    categories = [(c, c.share) for c in CATEGORIES]
    rate_s = rates.expected(len(gpus), HOUR_S) / HOUR_S
    faults: list[InjectedFault] = []
    at = start
    while rate_s > 0 and gpus:
        at += rng.expovariate(rate_s)
        if at >= start + horizon_s:
            break
        node, gpu = gpus[rng.randrange(len(gpus))]
        category = _weighted(rng, categories)
        code = category.codes[rng.randrange(len(category.codes))]
        entry = catalogue.entry(code)
        if entry is None or not entry.acts:
            raise ValueError(
                f"faults: category {category.name}: XID {code} does not act in the catalogue"
            )
        faults.append(
            InjectedFault(at, node, gpu, category.name, code, _weighted(rng, category.fixes))
        )
    return faults


def app_flood(
    job: str, nodes: Sequence[tuple[str, str]], at: float, code: int = 45
) -> list[XidEvent]:
    """One crashed job's application XID ``code`` on one GPU of each of its ``nodes``
    ((node, GPU UUID) pairs), all at ``at``: no GPU's fault (``job`` names it in the log)."""
    return [XidEvent(node, gpu, code, at) for node, gpu in nodes]


def strike(
    cluster: Cluster, fault: InjectedFault, started_only: bool = False
) -> tuple[list[str], float]:
    """Kill the jobs on ``fault``'s GPU as a crash would: each loses its work since its last
    checkpoint (``Cluster.restart_cost``) and goes back on its queue, as jobs stopped by a drain
    do. ``started_only``: only the jobs done relaunching (a job placed on a faulty GPU crashes
    when it starts to compute). Returns the killed jobs' ids and the GPU-seconds charged to
    them."""
    with cluster.lock:
        node = cluster.nodes.get(fault.node)
        gpu = next((g for g in node.gpus if g.uuid == fault.gpu), None) if node else None
        if gpu is None:
            return [], 0.0
        ids = sorted(({gpu.job} if gpu.job is not None else set()) | set(gpu.tenants))
        if started_only:
            ids = [
                i
                for i in ids
                if (until := cluster.jobs[i].restarting_until) is None or until <= cluster.time
            ]
        charged = 0.0
        for job_id in ids:
            job = cluster.jobs[job_id]
            charged += cluster.restart_cost(job)
            cluster.requeue(job)
            job.queued_at = cluster.time
        return ids, charged


@dataclass
class FaultState:
    """The open faults of a fleet, answering the ladder's steps as its nodes would (the
    simulated cluster's ``health``: ``gpuops.sim.fleet.health.NodeHealth``)."""

    open: dict[str, list[InjectedFault]] = field(default_factory=dict)
    """By node."""
    healed: list[tuple[InjectedFault, str, float]] = field(default_factory=list)
    """Each healed fault, the step that healed it and when."""

    def inject(self, fault: InjectedFault) -> None:
        self.open.setdefault(fault.node, []).append(fault)

    def faulty(self, node: str) -> bool:
        return bool(self.open.get(node))

    def _heal(self, node: str, step: str, heals: set[Fix], at: float, gpu: str = "") -> bool:
        kept: list[InjectedFault] = []
        for fault in self.open.get(node, []):
            if fault.fix in heals and (not gpu or fault.gpu == gpu):
                self.healed.append((fault, step, at))
            else:
                kept.append(fault)
        self.open[node] = kept
        return not kept

    def reset_gpu(self, node: str, gpu: str, at: float) -> bool:
        """Reset ``gpu`` of ``node``; whether the node is healthy after."""
        return self._heal(node, "reset_gpu", {Fix.RESET}, at, gpu)

    def reboot(self, node: str, at: float) -> bool:
        """Reboot ``node``; whether it is healthy after."""
        return self._heal(node, "reboot", {Fix.RESET, Fix.REBOOT}, at)

    def validate(self, node: str) -> tuple[bool, str]:
        """Whether ``node`` passes validation, and why not."""
        faults = self.open.get(node, [])
        if not faults:
            return True, ""
        return False, "; ".join(f"{f.gpu}: XID {f.code} ({f.category})" for f in faults)

    def replace(self, node: str, at: float) -> None:
        """A human replaced the node's faulty parts."""
        self._heal(node, "replace", set(Fix), at)
