"""The quota ledger: what each project may hold in each pool, and what it holds.

Owned by ``gpuops.sim.fleet.scheduler`` (one per cluster) and read with the cluster lock held
by the scheduler's parts (placing, slices, consolidation, grants). A project's *quota* in a
pool is its reserved GPUs plus its active grants (``Grant``, ``gpuops.sim.fleet.grants``). A
job within its project's quota is *guaranteed*; beyond it, it uses the pool's unreserved GPUs
(*shared*) or, when ``SchedulerSettings.borrowing`` is on or the pool *lends* (the ``lend``
verb), idle GPUs reserved by others (*borrowed*): ``QuotaLedger.kind`` says which. A slice
counts ``1/slices`` GPU of its quota (``QuotaLedger.weight``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from gpuops.sim.fleet.model import Job

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster

Key = tuple[str, str]
"""(project, pool)"""
Usage = dict[Key, float]
"""GPUs of guaranteed jobs per (project, pool)."""
Shared = dict[str, float]
"""GPUs of shared jobs (on unreserved GPUs) per pool."""
Kind = Literal["guaranteed", "shared", "borrowed"]
"""How a job is admitted to a pool: within its project's quota, on unreserved GPUs, or on
GPUs reserved by another project (preempted when the owner needs them)."""
SliceSizes = tuple[dict[str, int], dict[str, int]]
"""(pool -> GPUs at full size, pool -> GPUs reserved): ``QuotaLedger.slice_sizes``."""


@dataclass
class Grant:
    """An elastic quota grant: ``gpus`` more GPUs for ``project`` in ``pool`` until ``ends_at``."""

    id: str
    project: str
    pool: str
    gpus: int
    ends_at: float | None
    """Simulated time it ends by itself; None: when released (the engine's quota requests
    release their grants when their duration is over)."""
    nodes: list[str] = field(default_factory=list)
    """Nodes added for the grant; removed (whatever runs there) when it ends."""

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "project": self.project,
            "pool": self.pool,
            "gpus": self.gpus,
            "ends_at": self.ends_at,
            "nodes": list(self.nodes),
        }


class QuotaLedger:
    """Reservations, grants and lending pools, and the admissions they make."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.settings = cluster.config.scheduler
        self.reserved: dict[Key, int] = {}
        for project in cluster.config.reservations:
            for pool, gpus in project.reserved:
                self.reserved[(project.name, pool)] = gpus
        self.grants: dict[str, Grant] = {}
        self.ended_grants: dict[str, Grant] = {}
        self.lending: set[str] = set()
        """Pools whose idle reserved GPUs other projects may borrow (``lend``)."""

    def quota(self, project: str, pool: str) -> int:
        granted = sum(
            g.gpus for g in self.grants.values() if g.project == project and g.pool == pool
        )
        return self.reserved.get((project, pool), 0) + granted

    def quotas(self) -> dict[Key, int]:
        keys = set(self.reserved) | {(g.project, g.pool) for g in self.grants.values()}
        return {k: self.quota(*k) for k in sorted(keys)}

    def reserved_in(self) -> dict[str, int]:
        """GPUs of every pool that quotas (reservations and grants) hold for projects."""
        out = dict.fromkeys(self.cluster.pools, 0)
        for (_project, pool), gpus in self.quotas().items():
            out[pool] = out.get(pool, 0) + gpus
        return out

    def capacity(self) -> dict[str, int]:
        cap: dict[str, int] = dict.fromkeys(self.cluster.pools, 0)
        for node in self.cluster.nodes.values():
            if node.schedulable:
                cap[node.pool] += len(node.gpus)
        return cap

    def slice_sizes(self) -> SliceSizes:
        """(pool -> GPUs at full size, pool -> GPUs reserved): what
        ``Slices.ever_admits_on_slices`` reads, the same for every job of one fleet reading."""
        return self.full_size(), self.reserved_in()

    def full_size(self) -> dict[str, int]:
        """Pool -> its GPUs with all its machines up (``Cluster.machines``: its
        ``max_nodes``; without it, the most nodes it has had, or those it has while a quota
        grant's nodes are among them)."""
        c = self.cluster
        present: dict[str, int] = dict.fromkeys(c.pools, 0)
        for n in c.nodes.values():
            present[n.pool] += 1
        return {
            name: (
                spec.max_nodes
                if spec.max_nodes is not None
                else max(c.machines(name), present[name])
            )
            * spec.gpus_per_node
            for name, spec in c.pools.items()
        }

    def weight(self, job: Job, pool: str) -> float:
        """GPUs ``job`` counts for in ``pool``'s quotas: a slice is ``1/slices`` of one."""
        return job.gpus / self.cluster.pools[pool].slices if job.shared else float(job.gpus)

    def usage(self, exclude: str = "") -> tuple[Usage, Shared]:
        """GPUs of guaranteed jobs per (project, pool), and of shared jobs per pool (leaving
        out job ``exclude``)."""
        guaranteed: Usage = defaultdict(float)
        shared: Shared = defaultdict(float)
        for job in self.cluster.jobs.values():
            if job.state != "running" or job.borrowed or job.id == exclude:
                continue
            node = self.cluster.nodes.get(job.node or "")
            if node is None:
                continue
            key = (job.project, node.pool)
            w = self.weight(job, node.pool)
            if guaranteed[key] + w <= self.quota(*key):
                guaranteed[key] += w
            else:
                shared[node.pool] += w
        return guaranteed, shared

    def kind(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: Shared,
        capacity: dict[str, int],
        reserved_in: dict[str, int],
        gpus: float | None = None,
        lend: bool = True,
    ) -> Kind | None:
        """How ``job`` (or ``gpus`` of it) would be admitted to ``pool`` beside the usage
        given; None when it would not (``lend``: borrowing counts where the pool lends)."""
        key = (job.project, pool)
        need = float(job.gpus) if gpus is None else gpus
        if guaranteed[key] + need <= self.quota(*key):
            return "guaranteed"
        unreserved = max(capacity.get(pool, 0) - reserved_in.get(pool, 0), 0)
        if shared[pool] + need <= unreserved:
            return "shared"
        return "borrowed" if lend and self.lends(pool) and self.may_borrow(job) else None

    def lends(self, pool: str) -> bool:
        return self.settings.borrowing or pool in self.lending

    def may_borrow(self, job: Job) -> bool:
        """Only a job its owner can still take the GPUs back from borrows: one preempted
        ``max_preemptions`` times is never preempted again, and would keep them."""
        return job.preemptions < self.settings.max_preemptions


class Admission:
    """What admissions to other pools are weighed by, read once, when first asked, by a
    caller weighing many (a consolidation plan's moves, a fleet reading's ``pack_target``;
    one that weighs none reads nothing): the quotas' usage (``QuotaLedger.usage``, all jobs
    counted), capacity and reservations, and the pools a queued job that is not held may run
    in (their free GPUs are that job's)."""

    def __init__(self, ledger: QuotaLedger, held: set[str]) -> None:
        self._ledger = ledger
        self._held = held

    @cached_property
    def usage(self) -> tuple[Usage, Shared]:
        return self._ledger.usage()

    @cached_property
    def capacity(self) -> dict[str, int]:
        return self._ledger.capacity()

    @cached_property
    def reserved_in(self) -> dict[str, int]:
        return self._ledger.reserved_in()

    @cached_property
    def waited_for(self) -> frozenset[str]:
        c = self._ledger.cluster
        queued = (c.jobs[j] for q in c.queues.values() for j in q)
        return frozenset(
            pool
            for job in queued
            if job.priority_class not in self._held
            for pool in job.pools or (job.pool,)
        )
