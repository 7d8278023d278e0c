"""The fleet's scheduler: priority classes, GPU-model affinity with fallback, memory fit,
project quotas with borrowing, preemption with compensation, elastic quota grants, and holds.

Owned by ``gpuops.sim.fleet.cluster`` (one per cluster) and called with the cluster lock held:
``run`` after anything that frees or adds GPUs or jobs, ``grant``/``release`` and
``hold``/``unhold`` from ``gpuops.sim.fleet.operations``. The model:

- A project's *quota* in a pool is its reserved GPUs plus its active grants. A job within its
  project's quota is *guaranteed*; beyond it, it uses the pool's unreserved GPUs (*shared*) or,
  when ``SchedulerSettings.borrowing`` is on or the pool *lends* (the ``lend`` verb: an
  engine policy's elastic quota), idle GPUs reserved by others (*borrowed*).
- A shareable job (its job class says so) goes on free slices of GPUs that are shared already
  (``pack`` made them so), in any of its pools, before whole GPUs; a slice counts
  ``1/slices`` GPU of its quota. With ``SchedulerSettings.slice_borrowing`` it may borrow free
  slices of GPUs other projects reserve (a light job of one team beside another's).
- A guaranteed job that does not fit preempts borrowed jobs in its pool (the owner reclaims
  its quota); a job of a class that ``preempts`` also preempts lower, preemptible classes.
  The tenants of a shared GPU go together or not at all: the GPU is free only without them.
  Never a job that started less than ``min_runtime_s`` ago or was preempted
  ``max_preemptions`` times already.
- A preempted job is compensated: requeued at the front of its priority, its lost work (since
  its last checkpoint, or all of it without checkpoints) added back to its remaining time and
  credited to its project in GPU-seconds (``gpuops_preemption_credit_gpu_seconds_total``).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from gpuops.sim.fleet.errors import BadRequest, Conflict, NotFound
from gpuops.sim.fleet.model import (
    CULLED_PROFILES,
    SESSION_IDLE_S,
    SESSION_PROFILES,
    Gpu,
    Job,
    Node,
)
from gpuops.sim.fleet.sharing import fits

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(project, pool)"""
Usage = dict[Key, float]


def _placing_order(job: Job) -> tuple[int, bool, float]:
    """The order ``Scheduler.run`` places queued jobs in: highest priority first, preempted
    ones before the rest of their priority, then oldest."""
    return (-job.priority, not job.front, job.queued_at or job.submitted_at)


def _freed(node: Node, jobs: list[Job]) -> int:
    """GPUs of ``node`` that preempting ``jobs`` frees: held whole by one of them, or shared
    by them alone."""
    ids = {j.id for j in jobs}
    return sum(
        1
        for g in node.gpus
        if (g.job is not None and g.job in ids) or (g.tenants and ids.issuperset(g.tenants))
    )


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


@dataclass
class Move:
    """One job of a node being consolidated: where it goes (``Scheduler.drain_plan``)."""

    job: Job
    node: Node
    gpus: list[Gpu]
    shared: bool
    """On one slice of each of ``gpus`` (a job on slices stays on slices)."""
    borrowed: bool
    """On capacity borrowed from another project (only ever within the job's own pool: a job
    moved to another pool goes within its project's quota there or on unreserved GPUs)."""


class Admission:
    """What admissions to other pools are weighed by, read once, when first asked, by a
    caller weighing many (a consolidation plan's moves, a fleet reading's ``pack_target``;
    one that weighs none reads nothing): the quotas' usage (``Scheduler._usage``, all jobs
    counted), capacity and reservations, and the pools a queued job that is not held may run
    in (their free GPUs are that job's)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    @cached_property
    def usage(self) -> tuple[Usage, dict[str, float]]:
        return self._scheduler._usage()

    @cached_property
    def capacity(self) -> dict[str, int]:
        return self._scheduler._capacity()

    @cached_property
    def reserved_in(self) -> dict[str, int]:
        return self._scheduler._reserved_in()

    @cached_property
    def waited_for(self) -> frozenset[str]:
        s = self._scheduler
        queued = (s.cluster.jobs[j] for q in s.cluster.queues.values() for j in q)
        return frozenset(
            pool
            for job in queued
            if job.priority_class not in s.held
            for pool in job.pools or (job.pool,)
        )


@dataclass
class Claim:
    """What the consolidation plans of one pass took: drained nodes (no target), whole GPUs,
    the bytes of jobs put on slices of a GPU, and the nodes that take jobs (never drained)."""

    nodes: set[str] = field(default_factory=set)
    whole: set[str] = field(default_factory=set)
    slices: dict[str, list[int]] = field(default_factory=dict)
    targets: set[str] = field(default_factory=set)
    quota: dict[Key, float] = field(default_factory=dict)
    """GPUs (a slice: ``1/slices``) that jobs moved to another pool take of that pool's
    quotas: of their project's there, or of its unreserved GPUs (counted in both, as the
    scheduler would admit them, so that two moves never both count on the same room)."""

    def copy(self) -> Claim:
        return Claim(
            set(self.nodes),
            set(self.whole),
            {k: list(v) for k, v in self.slices.items()},
            set(self.targets),
            dict(self.quota),
        )

    def update(self, other: Claim) -> None:
        self.nodes, self.whole, self.slices = other.nodes, other.whole, other.slices
        self.targets, self.quota = other.targets, other.quota


class Scheduler:
    """Places queued jobs; holds quotas, grants and holds. Callers hold the cluster lock."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.settings = cluster.config.scheduler
        self.reserved: dict[Key, int] = {}
        for project in cluster.config.reservations:
            for pool, gpus in project.reserved:
                self.reserved[(project.name, pool)] = gpus
        self.grants: dict[str, Grant] = {}
        self.ended_grants: dict[str, Grant] = {}
        self.held: set[str] = set()
        self.held_at: dict[str, float] = {}
        """held priority class -> when its hold began (``unhold`` shifts its jobs' wait)."""
        self.lending: set[str] = set()
        """Pools whose idle reserved GPUs other projects may borrow (``lend``)."""
        self.preemptions: dict[str, int] = defaultdict(int)
        self.credit_gpu_s: dict[str, float] = defaultdict(float)

    # --- quotas ----------------------------------------------------------------------------

    def quota(self, project: str, pool: str) -> int:
        granted = sum(
            g.gpus for g in self.grants.values() if g.project == project and g.pool == pool
        )
        return self.reserved.get((project, pool), 0) + granted

    def quotas(self) -> dict[Key, int]:
        keys = set(self.reserved) | {(g.project, g.pool) for g in self.grants.values()}
        return {k: self.quota(*k) for k in sorted(keys)}

    def _reserved_in(self) -> dict[str, int]:
        """GPUs of every pool that quotas (reservations and grants) hold for projects."""
        out = dict.fromkeys(self.cluster.pools, 0)
        for (_project, pool), gpus in self.quotas().items():
            out[pool] = out.get(pool, 0) + gpus
        return out

    def _capacity(self) -> dict[str, int]:
        cap: dict[str, int] = dict.fromkeys(self.cluster.pools, 0)
        for node in self.cluster.nodes.values():
            if node.schedulable:
                cap[node.pool] += len(node.gpus)
        return cap

    def slice_sizes(self) -> tuple[dict[str, int], dict[str, int]]:
        """(pool -> GPUs at full size, pool -> GPUs reserved): what ``ever_admits_on_slices``
        reads, the same for every job of one fleet reading."""
        return self._full_size(), self._reserved_in()

    def _full_size(self) -> dict[str, int]:
        """Pool -> its GPUs with all its machines up (``max_nodes``; without it, those it has)."""
        c = self.cluster
        present: dict[str, int] = dict.fromkeys(c.pools, 0)
        for n in c.nodes.values():
            present[n.pool] += 1
        return {
            name: (spec.max_nodes if spec.max_nodes is not None else present[name])
            * spec.gpus_per_node
            for name, spec in c.pools.items()
        }

    def weight(self, job: Job, pool: str) -> float:
        """GPUs ``job`` counts for in ``pool``'s quotas: a slice is ``1/slices`` of one."""
        return job.gpus / self.cluster.pools[pool].slices if job.shared else float(job.gpus)

    def _usage(self, exclude: str = "") -> tuple[Usage, dict[str, float]]:
        """GPUs of guaranteed jobs per (project, pool), and of shared jobs per pool (leaving
        out job ``exclude``)."""
        guaranteed: Usage = defaultdict(float)
        shared: dict[str, float] = defaultdict(float)
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

    def demand(self) -> dict[str, int]:
        """Queued jobs (not held) that one more node could place, by the first of their pools
        that has machines left to power up (``max_nodes``) and would admit them there (their
        project's quota, or unreserved GPUs of the pool at full size): the signal a power-up or
        scale-out policy acts on, as a cluster autoscaler's expander picks a node group. Jobs
        that the GPUs of nodes still booting in any of their pools will take, in the order
        ``run`` places them, are not counted (no second power-up for them). A pool of a model
        not among the job's class's ``models`` (a fallback) counts it only once it has waited
        that pool's boot time since it last queued (``Job.waiting_since``), unless none of its
        pools is of those models."""
        c = self.cluster
        out = dict.fromkeys(c.pools, 0)
        queued = [c.jobs[j] for q in c.queues.values() for j in q]
        if not queued:
            return out
        guaranteed, shared = self._usage()
        present: dict[str, int] = dict.fromkeys(c.pools, 0)
        booting: dict[str, int] = dict.fromkeys(c.pools, 0)
        for n in c.nodes.values():
            present[n.pool] += 1
            if n.booting_until is not None and not n.failed and not n.drained:
                booting[n.pool] += len(n.gpus)  # a failed or drained one takes nobody
        full = self._full_size()
        reserved_in = self._reserved_in()
        # in the order ``run`` places them: the job a booting node is counted for is the one
        # that will get it (a lower priority's, counted first, lost a boot time to a higher)
        queued.sort(key=_placing_order)
        for job in queued:
            if job.priority_class in self.held:
                continue
            models = c.priority_class(job.priority_class).models
            since = job.waiting_since if job.waiting_since is not None else job.submitted_at
            # a job none of whose pools is of its class's models (its memory rules them out,
            # or it names a pool) has nothing better to wait for
            own = any(c.pools[p].model in models for p in job.pools or (job.pool,))
            for pool in job.pools or (job.pool,):
                spec = c.pools[pool]
                if job.gpus > spec.gpus_per_node:
                    continue
                if self._kind(job, pool, guaranteed, shared, full, reserved_in) is None:
                    continue
                if booting[pool] >= job.gpus:
                    # a node on its way takes it: no second power-up for it, here or in a
                    # later pool of its list (the last machine of a pool booting once made
                    # the pool count as full, and a rental was powered up for the same job)
                    booting[pool] -= job.gpus
                    break
                if spec.max_nodes is None or present[pool] >= spec.max_nodes:
                    continue
                if own and spec.model not in models and c.time - since < spec.boot_s:
                    # a fallback pool's machine for a job that has waited less than it takes
                    # to boot: GPUs of its own models free up as often as not before it is
                    # ready (the ski-rental break-even again: wait as long as the power-up
                    # costs). Seed 42's day powered up 14 RTX machines for training that
                    # waited for an A100 or H100; 11 of them never ran a job.
                    break
                out[pool] += 1
                break
        return out

    def borrow_demand(self) -> dict[str, int]:
        """Queued jobs (not held) that only borrowing could place now, by the first of their
        pools with free GPUs for them where their project has no room: what lending that
        pool's idle reserved GPUs would start (the signal of a lend policy)."""
        c = self.cluster
        out = dict.fromkeys(c.pools, 0)
        queued = [c.jobs[j] for q in c.queues.values() for j in q]
        if not queued:
            return out
        guaranteed, shared = self._usage()
        capacity = self._capacity()
        reserved_in = self._reserved_in()
        for job in queued:
            if job.priority_class in self.held:
                continue
            pools = job.pools or (job.pool,)
            if any(
                self._kind(job, p, guaranteed, shared, capacity, reserved_in, lend=False)
                for p in pools
            ):
                continue  # it can be admitted somewhere without borrowing (it waits for room)
            for pool in pools:
                if c.best_fit(pool, job.gpus) is not None:
                    out[pool] += 1
                    break
        return out

    # --- the scheduling pass ------------------------------------------------------------------

    def run(self) -> None:
        """Place queued jobs: highest priority first, preempted ones before the rest of their
        priority, then oldest; each in its preferred pool that has room, else preempting."""
        c = self.cluster
        queued = [c.jobs[j] for q in c.queues.values() for j in q]
        if not queued:
            return
        queued.sort(key=_placing_order)
        guaranteed, shared = self._usage()
        capacity = self._capacity()
        reserved_in = self._reserved_in()
        free = {pool: 0 for pool in c.pools}
        for n in c.nodes.values():
            if n.schedulable:
                free[n.pool] += len(n.free_gpus())
        preempt_budget = 16  # attempts per pass: keeps a pass bounded on a long queue
        for job in queued:
            if job.priority_class in self.held:
                continue
            # a shareable job takes free slices of shared GPUs in any of its pools, its own
            # quota's or unreserved ones first, then borrowed ones, before a whole GPU in its
            # preferred pool: a GPU powered for one light job is the waste sharing is for (an
            # inference service alone on a T4 it cannot share), and a borrowed slice costs at
            # worst a compensated preemption when its owner needs it
            pools = job.pools or (job.pool,)
            placed = job.shareable and any(
                self._on_slices(job, pool, guaranteed, shared, capacity, reserved_in, borrowed)
                for borrowed in (False, True)
                for pool in pools
            )
            for pool in () if placed else pools:
                if free.get(pool, 0) < job.gpus:
                    continue
                kind = self._kind(job, pool, guaranteed, shared, capacity, reserved_in)
                if kind is None:
                    continue
                fit = c.best_fit(pool, job.gpus)
                if fit is None:
                    continue
                self._place(job, fit, kind, guaranteed, shared)
                free[pool] -= job.gpus
                placed = True
                break
            if placed or not self.settings.preemption or preempt_budget <= 0:
                continue
            preempt_budget -= 1
            if job.shareable and any(
                self._reclaim_slice(job, pool, guaranteed, shared, capacity, reserved_in)
                for pool in pools
            ):
                continue
            for pool in pools:
                kind = self._kind(job, pool, guaranteed, shared, capacity, reserved_in)
                # a light job waiting for a machine powering up stops no borrower here either
                waits = job.shareable and self._awaits_power(job, pool)
                may_reclaim = kind == "guaranteed" and not waits
                if not may_reclaim and not c.priority_class(job.priority_class).preempts:
                    continue
                found = self._victims(job, pool, may_reclaim)
                if found is None:
                    continue
                target, victims = found
                for victim in victims:
                    self.preempt(victim, by=job)
                # counted again, not undone by guess: a victim's share (a slice's, a whole
                # GPU's) left exactly the bucket (guaranteed, shared) ``_usage`` put it in
                guaranteed, shared = self._usage()
                if kind is None:  # room made by priority: it runs as borrowed capacity
                    kind = "borrowed" if self._lends(pool) else "shared"
                self._place(job, target, kind, guaranteed, shared)
                # victims on slices free a GPU only with its last tenant: count, not add up
                free[pool] = sum(
                    len(n.free_gpus()) for n in c.nodes.values() if n.pool == pool and n.schedulable
                )
                break

    def _kind(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: dict[str, float],
        capacity: dict[str, int],
        reserved_in: dict[str, int],
        gpus: float | None = None,
        lend: bool = True,
    ) -> str | None:
        key = (job.project, pool)
        need = float(job.gpus) if gpus is None else gpus
        if guaranteed[key] + need <= self.quota(*key):
            return "guaranteed"
        unreserved = max(capacity.get(pool, 0) - reserved_in.get(pool, 0), 0)
        if shared[pool] + need <= unreserved:
            return "shared"
        return "borrowed" if lend and self._lends(pool) and self._may_borrow(job) else None

    def _awaits_power(self, job: Job, pool: str) -> bool:
        """Whether ``job`` waits for a machine of ``pool`` rather than stop another project's
        job on a lent slice: it has waited less than two boot times (the power-up policy's
        delay, then the boot) since it last entered the queue (``Job.waiting_since``: a job
        preempted off another pool waits afresh, not since its submit hours ago), and a
        machine of the pool boots or one more can be powered up (``max_nodes``)."""
        c = self.cluster
        spec = c.pools[pool]
        since = job.waiting_since if job.waiting_since is not None else job.submitted_at
        if c.time - since >= 2 * spec.boot_s:
            return False  # waited long enough, whatever boots (maybe for other jobs)
        nodes = [n for n in c.nodes.values() if n.pool == pool]
        if any(n.booting_until is not None for n in nodes):
            return True
        return spec.max_nodes is not None and len(nodes) < spec.max_nodes

    def _restarted_lately(self, job: Job) -> bool:
        """Stopped and started again (preempted, packed, moved) within ``move_interval``: such
        a job borrows no slice, so that one the owner took a slice back from runs where it
        may stay, not on the next lent slice that will be taken back too (ping-pong)."""
        moved = job.moved_at
        return moved is not None and self.cluster.time - moved < self.settings.move_interval_s

    def _stoppable(self, job: Job) -> bool:
        """Past ``min_runtime`` since it (re)started and under ``max_preemptions``."""
        s = self.settings
        ran = self.cluster.time - (job.started_at or 0.0)
        return job.preemptions < s.max_preemptions and ran >= s.min_runtime_s

    @staticmethod
    def _reclaimable(other: Job, owner: Job) -> bool:
        """``other`` runs on capacity ``owner``'s project lends it (the owner reclaims)."""
        return other.borrowed and other.project != owner.project

    def _may_borrow(self, job: Job) -> bool:
        """Only a job its owner can still take the GPUs back from borrows: one preempted
        ``max_preemptions`` times is never preempted again, and would keep them."""
        return job.preemptions < self.settings.max_preemptions

    def admits_on_slices(self, job: Job, pool: str, a: Admission | None = None) -> str | None:
        """How ``job``'s project may run it on slices of ``pool`` — ``guaranteed`` (its quota
        there), ``shared`` (unreserved GPUs), ``borrowed`` (others' reserved GPUs, with
        ``slice_borrowing``: preempted when the owner needs them) — or None, not counting
        what it holds now: the admission ``_on_slices`` makes, for ``pack``. ``a``: read once
        by a caller asking for many jobs that hold no GPU of ``pool`` (then what they hold
        counts in no pool asked)."""
        spec = self.cluster.pools[pool]
        if spec.sharing is None:
            return None
        if a is None:
            guaranteed, shared = self._usage(exclude=job.id)
            capacity, reserved_in = self._capacity(), self._reserved_in()
        else:
            (guaranteed, shared), capacity, reserved_in = a.usage, a.capacity, a.reserved_in
        w = job.gpus / spec.slices
        return self._slice_kind(job, pool, guaranteed, shared, capacity, reserved_in, w)

    def pack_target(
        self, job: Job, node: Node, a: Admission | None = None
    ) -> tuple[str, tuple[Node, list[Gpu]]] | None:
        """Where ``pack`` would move ``job``, held whole on ``node``, now: (its admission,
        ``admits_on_slices``; the node and GPUs, ``slices_for``) in the first of its pools that
        admits it on slices and has GPUs shared already with a free slice for it, on another
        node. None when none has, or the job was moved within ``move_interval`` (then it is
        only shared in place, no ping-pong with ``consolidate``). ``a``: as for
        ``admits_on_slices``, for a job on a pool that cannot share."""
        if self._restarted_lately(job):
            return None
        for pool in job.pools or (job.pool,):
            kind = self.admits_on_slices(job, pool, a)
            if kind is None:
                continue  # its quota or the pool's reservations do not let it run there
            target = self.slices_for(job, pool, exclude=node.name)
            if target is not None:
                return kind, target
        return None

    def ever_admits_on_slices(
        self, job: Job, pool: str, sizes: tuple[dict[str, int], dict[str, int]] | None = None
    ) -> bool:
        """Whether ``job``'s project may run it on slices of ``pool`` at all, whatever is in
        use now: its quota there, unreserved GPUs at the pool's full size (``max_nodes``), or
        other projects' slices where the fleet lends them (``Cluster.shares_elsewhere``).
        ``sizes``: ``slice_sizes()``, read once by a caller that asks for many jobs."""
        full_size, reserved_in = sizes or self.slice_sizes()
        full = full_size[pool]
        reserved = reserved_in.get(pool, 0)
        lends = self.settings.slice_borrowing and reserved > 0 and self._may_borrow(job)
        return self.quota(job.project, pool) > 0 or full > reserved or lends

    def _slice_kind(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: dict[str, float],
        capacity: dict[str, int],
        reserved_in: dict[str, int],
        w: float,
    ) -> str | None:
        kind = self._kind(job, pool, guaranteed, shared, capacity, reserved_in, w, lend=False)
        if (
            kind is None
            and self.settings.slice_borrowing
            and reserved_in.get(pool, 0) > 0  # an owner to lend them, and to take them back
            and self._may_borrow(job)
            and not self._restarted_lately(job)
        ):
            return "borrowed"
        return kind

    def _lends(self, pool: str) -> bool:
        return self.settings.borrowing or pool in self.lending

    def _on_slices(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: dict[str, float],
        capacity: dict[str, int],
        reserved_in: dict[str, int],
        borrowed: bool,
    ) -> bool:
        """Place ``job`` on free slices of GPUs already shared in ``pool``: within its
        project's quota or on unreserved GPUs, or (``borrowed``, with ``slice_borrowing``)
        borrowed from the owner, who preempts it when it needs the room (``_victims``,
        ``_reclaim_slice``); False when none fit, or when its admission there is not the
        kind asked for (``run`` asks every pool for the one, then for the other: no search
        twice)."""
        spec = self.cluster.pools[pool]
        if spec.sharing is None:
            return False
        w = job.gpus / spec.slices
        kind = self._slice_kind(job, pool, guaranteed, shared, capacity, reserved_in, w)
        if kind is None or (kind == "borrowed") != borrowed:
            return False
        found = self.slices_for(job, pool)
        if found is None:
            return False
        node, gpus = found
        self._start_on_slices(job, node, gpus, kind, w, guaranteed, shared)
        return True

    def _start_on_slices(
        self,
        job: Job,
        node: Node,
        gpus: list[Gpu],
        kind: str,
        w: float,
        guaranteed: Usage,
        shared: dict[str, float],
    ) -> None:
        pool = node.pool
        self.cluster.queues[job.pool].remove(job.id)
        job.borrowed = kind == "borrowed"
        if kind == "guaranteed":
            guaranteed[(job.project, pool)] += w
        elif kind == "shared":
            shared[pool] += w
        self.cluster.start_shared(job, node, gpus)

    def _reclaim_slice(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: dict[str, float],
        capacity: dict[str, int],
        reserved_in: dict[str, int],
    ) -> bool:
        """The owner takes back slices: a shareable ``job`` within its project's quota in
        ``pool`` that no free slice takes preempts borrowed tenants of other projects (past
        ``min_runtime``, under ``max_preemptions``) on shared GPUs of one node until it fits
        each of ``job.gpus`` GPUs, the least work lost first; False when no node can, or
        while a machine of the pool powers up for it (``_awaits_power``): a light job's few
        minutes, against stopping another team's service."""
        c = self.cluster
        spec = c.pools[pool]
        if spec.sharing is None:
            return False
        w = job.gpus / spec.slices
        key = (job.project, pool)
        if guaranteed[key] + w > self.quota(*key):
            return False  # beyond its quota it has nothing to reclaim
        if self._awaits_power(job, pool):
            return False  # a machine powering up gives it room within a boot: nobody stops
        sharing = spec.sharing

        def room(g: Gpu, tenants: list[Job], gone: list[Job]) -> bool:
            """``job`` fits ``g`` with ``gone`` of its ``tenants`` preempted."""
            kept = [c.job_bytes(t, g) for t in tenants if t not in gone]
            return fits(sharing, kept, c.job_bytes(job, g), g.model.memory_bytes, spec.slices)

        best: tuple[float, Node, list[Gpu], list[Job]] | None = None
        for node in c.nodes.values():
            if node.pool != pool or not node.schedulable:
                continue
            options: list[tuple[float, Gpu, list[Job]]] = []
            for g in node.gpus:
                if not g.tenants or job.id in g.tenants:
                    continue
                tenants = [c.jobs[t] for t in g.tenants]
                victims = sorted(
                    (t for t in tenants if self._reclaimable(t, job) and self._stoppable(t)),
                    key=lambda t: (self._lost_work(t) * t.gpus, t.id),
                )
                gone: list[Job] = []
                for victim in [None, *victims]:
                    if victim is not None:
                        gone.append(victim)
                    if room(g, tenants, gone):
                        for spared in list(reversed(gone)):  # not needed after all: spared
                            if room(g, tenants, [t for t in gone if t is not spared]):
                                gone.remove(spared)
                        cost = sum(self._lost_work(v) * v.gpus for v in gone)
                        options.append((cost, g, list(gone)))
                        break
            if len(options) < job.gpus:
                continue
            options.sort(key=lambda o: (o[0], o[1].uuid))
            chosen = options[: job.gpus]
            victims_all: list[Job] = []
            for _cost, _g, vs in chosen:
                victims_all.extend(v for v in vs if v not in victims_all)
            cost = sum(self._lost_work(v) * v.gpus for v in victims_all)
            if best is None or cost < best[0]:
                best = (cost, node, [g for _c, g, _v in chosen], victims_all)
        if best is None:
            return False
        _cost, node, gpus, victims = best
        for victim in victims:
            self.preempt(victim, by=job)  # borrowed: counted in no quota (``_usage``)
        # within its quota (checked above; preempting borrowers changes no quota's usage)
        self._start_on_slices(job, node, gpus, "guaranteed", w, guaranteed, shared)
        return True

    def slices_for(
        self, job: Job, pool: str, fresh: bool = False, exclude: str = ""
    ) -> tuple[Node, list[Gpu]] | None:
        """``job.gpus`` GPUs of one schedulable node of ``pool`` with a free slice and memory
        for ``job``: shared ones first (the fullest), then — with ``fresh`` — free GPUs
        (which ``pack`` turns into shared ones). None when no node has them."""
        c = self.cluster
        spec = c.pools[pool]
        if spec.sharing is None:
            return None
        best: tuple[tuple[int, int], Node, list[Gpu]] | None = None
        for node in c.nodes.values():
            if node.pool != pool or not node.schedulable or node.name == exclude:
                continue
            room = [
                g
                for g in node.gpus
                if g.job is None
                and (g.tenants or fresh)
                and job.id not in g.tenants
                and fits(
                    spec.sharing,
                    [c.job_bytes(c.jobs[t], g) for t in g.tenants],
                    c.job_bytes(job, g),
                    g.model.memory_bytes,
                    spec.slices,
                )
            ]
            if len(room) < job.gpus:
                continue
            room.sort(key=lambda g: -len(g.tenants))
            chosen = room[: job.gpus]
            score = (-sum(len(g.tenants) for g in chosen), node.seq)
            if best is None or score < best[0]:
                best = (score, node, chosen)
        return None if best is None else (best[1], best[2])

    def _place(
        self, job: Job, node: Node, kind: str, guaranteed: Usage, shared: dict[str, float]
    ) -> None:
        c = self.cluster
        c.queues[job.pool].remove(job.id)
        job.borrowed = kind == "borrowed"
        if kind == "guaranteed":
            guaranteed[(job.project, node.pool)] += job.gpus
        elif kind == "shared":
            shared[node.pool] += job.gpus
        c.start(job, node, node.free_gpus()[: job.gpus])

    def _victims(self, job: Job, pool: str, reclaim: bool) -> tuple[Node, list[Job]] | None:
        """The node of ``pool`` where preempting the least work makes room for ``job``: jobs
        holding GPUs whole, or every tenant of a shared GPU (a GPU is free only with its last
        tenant gone; tenants on several GPUs free their slices of each)."""
        c = self.cluster
        mine = c.priority_class(job.priority_class)

        def victim(other: Job) -> bool:
            if not self._stoppable(other):
                return False
            theirs = c.priority_class(other.priority_class)
            by_quota = reclaim and self._reclaimable(other, job)
            by_priority = mine.preempts and theirs.preemptible and other.priority < job.priority
            return by_quota or by_priority

        best: tuple[float, Node, list[Job]] | None = None
        for node in c.nodes.values():
            if node.pool != pool or not node.schedulable:
                continue
            free = len(node.free_gpus())
            # each unit frees its GPUs when all its jobs go: a job held whole, or the tenants
            # of one shared GPU. Sorted: a set's order changes with the interpreter's string
            # hashing, and the same seed must give the same run in every process
            units: list[list[Job]] = []
            for jid in sorted({g.job for g in node.gpus if g.job is not None}):
                other = c.jobs[jid]
                if victim(other):
                    units.append([other])
            for g in node.gpus:
                if g.tenants:
                    tenants = [c.jobs[t] for t in sorted(g.tenants)]
                    if all(victim(t) for t in tenants):
                        units.append(tenants)
            if free + _freed(node, [v for u in units for v in u]) < job.gpus:
                continue
            # the unit adding the least (priority first, then lost work) until enough GPUs are
            # free, counted exactly (a tenant on two GPUs frees both, with their other
            # tenants); then the units not needed after all, latest first, are spared
            picked: list[list[Job]] = []
            while free + _freed(node, [v for u in picked for v in u]) < job.gpus:
                taken = {v.id for u in picked for v in u}
                picked.append(
                    min(
                        (u for u in units if u not in picked and any(v.id not in taken for v in u)),
                        key=lambda u: (
                            max(v.priority for v in u if v.id not in taken),
                            sum(self._lost_work(v) * v.gpus for v in u if v.id not in taken),
                        ),
                    )
                )
            for unit in list(reversed(picked)):
                rest = [u for u in picked if u is not unit]
                if free + _freed(node, [v for u in rest for v in u]) >= job.gpus:
                    picked = rest
            chosen: list[Job] = []
            for unit in picked:
                chosen.extend(v for v in unit if v not in chosen)
            cost = sum(self._lost_work(v) * v.gpus for v in chosen)
            if best is None or cost < best[0]:
                best = (cost, node, chosen)
        return None if best is None else (best[1], best[2])

    @staticmethod
    def _lost_work(job: Job) -> float:
        """Work a stop loses: since the last checkpoint, all of it without checkpoints, none
        for a session (a notebook, a service: its duration is wall-clock time, as
        ``Cluster.restart_cost`` counts it)."""
        if job.profile in SESSION_PROFILES:
            return 0.0
        if job.checkpoint_interval_s is not None:
            return job.since_checkpoint_s
        if job.duration_s is None or job.remaining_s is None:
            return 0.0
        return job.duration_s - job.remaining_s

    def preempt(self, job: Job, by: Job | None = None) -> float:
        """Stop ``job`` and requeue it at the front with its lost work compensated; returns
        the GPU-seconds lost (credited to its project)."""
        c = self.cluster
        lost = self._lost_work(job)
        if job.remaining_s is not None and job.duration_s is not None:
            job.remaining_s = min(job.remaining_s + lost, job.duration_s)
        job.since_checkpoint_s = 0.0
        job.preemptions += 1
        job.front = True
        job.borrowed = False
        job.lost_gpu_s += lost * job.gpus
        job.moved_at = c.time  # restarted: ``pack`` and ``consolidate`` leave it for a while
        self.preemptions[job.project] += 1
        self.credit_gpu_s[job.project] += lost * job.gpus
        log.debug("%s preempted by %s; %.0f GPU-s lost", job.id, by.id if by else "-", lost)
        c.requeue(job)
        return lost * job.gpus

    # --- consolidation ------------------------------------------------------------------------

    def drain_plan(self, node: Node, claim: Claim | None = None) -> list[Move]:
        """Where each job on ``node`` would go so that the node empties (``consolidate``): a
        free GPU (or a slice of a shared GPU, for a job on slices) of another schedulable node
        that runs jobs already, in the node's pool or in another of the job's pools (its
        class's models, never a fallback pool: ``_move_pools``), the fullest first (best fit,
        as the scheduler places) in the first of those pools in the job's order that has room
        (for a job on slices, free slices of GPUs shared already before a free GPU), never an
        idle node (the move would power nothing down), a node being drained, of a
        quota grant or in ``claim.nodes``. In another pool the job goes only as the scheduler
        would admit it there without borrowing (its project's quota, or unreserved GPUs:
        ``_admits_move``) and only where no queued job waits for that pool (its free GPUs are
        theirs); in its own
        pool it keeps its admission, and the consolidation policy waits for the pool's queue.
        Raises Conflict naming the first reason it cannot: the node is not up, of a quota
        grant, idle (power-down's business), more than half used (cluster-autoscaler's
        scale-down threshold: moving more costs more restarts than a node saves), a job that
        would lose its work (no checkpoints and not a session), a notebook without
        checkpoints that was in use (its GPU load above ``SESSION_IDLE_UTILIZATION``) within
        ``SESSION_IDLE_S``, a job moved less than ``move_interval_s`` ago, no room, or (with
        ``claim``) the node takes the jobs of an earlier plan. ``claim`` (updated only when
        the plan succeeds) keeps what earlier plans of the same pass took."""
        c = self.cluster
        if not node.schedulable:
            raise Conflict(f"node {node.name} is {node.state}; only an up node is consolidated")
        if any(node.name in g.nodes for g in self.grants.values()):
            raise Conflict(f"node {node.name} holds a quota grant; release_quota removes it")
        used = [g for g in node.gpus if g.job is not None or g.tenants]
        if not used:
            raise Conflict(f"node {node.name} is idle: nothing to move (power it down)")
        if 2 * len(used) > len(node.gpus):
            raise Conflict(
                f"node {node.name} uses {len(used)} of its {len(node.gpus)} GPUs: more than half"
            )
        if claim is not None and node.name in claim.targets:
            raise Conflict(f"node {node.name} takes the jobs of another node being drained")
        mine = Claim() if claim is None else claim.copy()
        mine.nodes.add(node.name)
        # a grant's nodes go when it ends, whatever runs there: never a target either
        mine.nodes.update(n for g in self.grants.values() for n in g.nodes)
        jobs = sorted((c.jobs[j] for j in node.job_ids()), key=lambda j: (-j.gpus, j.id))
        admission = Admission(self)
        moves = []
        for job in jobs:
            self._movable(job)
            move = self._move_target(job, node.pool, mine, admission)
            if move is None:
                pools = self._move_pools(job, node.pool)
                raise Conflict(
                    f"no other node of pool{'s' if len(pools) > 1 else ''} {', '.join(pools)} "
                    f"has room for job {job.id} ({job.gpus} GPU{'s' if job.gpus > 1 else ''}"
                    f"{' on slices' if job.shared else ''}); node {node.name} stays"
                )
            moves.append(move)
            mine.targets.add(move.node.name)
        if claim is not None:
            claim.update(mine)
        return moves

    def _movable(self, job: Job) -> None:
        c = self.cluster
        if job.checkpoint_interval_s is None and job.profile not in SESSION_PROFILES:
            raise Conflict(
                f"job {job.id} has no checkpoints and is not a session: moving it would lose "
                "its work"
            )
        # a notebook in use is its user's open session; a service (inference) is restarted
        # elsewhere as the descheduler evicts a Deployment's pod for a scale-down, paying its
        # relaunch (``restart_s``, its GPUs held idle meanwhile), as ``pack`` moves it
        if job.checkpoint_interval_s is None and job.profile in CULLED_PROFILES:
            since = max(t for t in (job.busy_at, job.started_at, 0.0) if t is not None)
            if c.time - since < SESSION_IDLE_S:
                raise Conflict(
                    f"job {job.id} ({job.profile} session, no checkpoints) was in use "
                    f"{(c.time - since) / 60:.0f} min ago: a session moves only after "
                    f"{SESSION_IDLE_S / 60:.0f} min idle"
                )
        interval = self.settings.move_interval_s
        if job.moved_at is not None and c.time - job.moved_at < interval:
            raise Conflict(
                f"job {job.id} was moved {(c.time - job.moved_at) / 60:.0f} min ago; not again "
                f"within {interval / 60:.0f} min (scheduler.move_interval)"
            )

    def _move_pools(self, job: Job, home: str) -> list[str]:
        """The pools a job on a node of ``home`` may be moved to, best first: its pools of its
        class's models, in their order (``Job.pools``), and ``home``; never a fallback pool
        (a light service onto a whole H100 would empty a T4 node by wasting a bigger GPU)."""
        c = self.cluster
        models = c.priority_class(job.priority_class).models
        pools = [
            p
            for p in job.pools or (job.pool,)
            if p == home or not models or c.pools[p].model in models
        ]
        return pools if home in pools else [home, *pools]

    def _admits_move(self, job: Job, pool: str, a: Admission, claim: Claim) -> bool:
        """Whether ``job`` would be admitted to ``pool`` (not its own) as guaranteed (its
        project's quota there) or shared (unreserved GPUs), never borrowed (``_kind``), beside
        what earlier moves of the pass took there (``claim.quota``), and no queued job waits
        for ``pool``."""
        if pool in a.waited_for:
            return False
        key = (job.project, pool)
        guaranteed, shared = a.usage
        taken = {key: guaranteed[key] + claim.quota.get(key, 0.0)}
        others = {pool: shared[pool] + claim.quota.get(("", pool), 0.0)}
        w = self.weight(job, pool)
        kind = self._kind(job, pool, taken, others, a.capacity, a.reserved_in, w, lend=False)
        return kind is not None

    def _move_target(self, job: Job, home: str, claim: Claim, a: Admission) -> Move | None:
        c = self.cluster
        best: tuple[tuple[int, int, int, int], Move] | None = None
        pools = self._move_pools(job, home)
        for rank, pool in enumerate(pools):
            spec = c.pools[pool]
            if job.shared and spec.sharing is None:
                continue  # a job on slices stays on slices
            if pool != home and not self._admits_move(job, pool, a, claim):
                continue
            for other in c.nodes.values():
                if other.pool != pool or not other.schedulable or other.name in claim.nodes:
                    continue
                if other.idle():  # moving onto an idle node powers nothing down: it saves nothing
                    continue
                free = [g for g in other.free_gpus() if g.uuid not in claim.whole]
                free = [g for g in free if g.uuid not in claim.slices]
                if not job.shared:
                    if len(free) < job.gpus:
                        continue
                    score = (0, rank, len(free), other.seq)
                    move = Move(job, other, free[: job.gpus], False, job.borrowed)
                else:
                    assert spec.sharing is not None
                    need = c.job_bytes(job, other.gpus[0])  # one model per pool
                    memory = other.gpus[0].model.memory_bytes
                    if not fits(spec.sharing, [], need, memory, spec.slices):
                        continue  # too big for one slice here (another model's MIG slice)
                    room = [
                        g
                        for g in other.gpus
                        if g.job is None
                        and g.uuid not in claim.whole
                        and (g.tenants or g.uuid in claim.slices)
                        and fits(
                            spec.sharing,
                            [c.job_bytes(c.jobs[t], g) for t in g.tenants]
                            + claim.slices.get(g.uuid, []),
                            need,
                            g.model.memory_bytes,
                            spec.slices,
                        )
                    ]
                    room.sort(key=lambda g: -len(g.tenants) - len(claim.slices.get(g.uuid, [])))
                    fresh = max(job.gpus - len(room), 0)
                    if fresh > len(free):
                        continue
                    chosen = room[: job.gpus] + free[:fresh]
                    score = (fresh, rank, len(free), other.seq)
                    move = Move(job, other, chosen, True, job.borrowed)
                if best is None or score < best[0]:
                    best = (score, move)
        if best is None:
            return None
        move = best[1]
        pool = move.node.pool
        if pool != home:  # its room in the pool's quotas, counted in both buckets
            w = self.weight(job, pool)
            for key in ((job.project, pool), ("", pool)):
                claim.quota[key] = claim.quota.get(key, 0.0) + w
            move.borrowed = False
        for g in move.gpus:
            if move.shared:
                claim.slices.setdefault(g.uuid, []).append(c.job_bytes(job, g))
            else:
                claim.whole.add(g.uuid)
        return move

    # --- elastic quota ------------------------------------------------------------------------

    def grant(
        self, grant_id: str, project: str, pool: str, gpus: int, duration_s: float | None
    ) -> Grant:
        """Raise ``project``'s quota in ``pool`` by ``gpus`` for ``duration_s`` and add the nodes
        that hold them; a grant id seen before returns that grant unchanged."""
        c = self.cluster
        if grant_id in self.grants:
            return self.grants[grant_id]
        if grant_id in self.ended_grants:
            raise Conflict(f"grant {grant_id!r} already ended; a new grant needs a new id")
        spec = c.pool(pool)
        if not 1 <= gpus <= 64 * spec.gpus_per_node:
            raise BadRequest(f"gpus must be within [1, {64 * spec.gpus_per_node}], got {gpus}")
        if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
            raise BadRequest(f"duration_s must be a finite number > 0, got {duration_s}")
        nodes = math.ceil(gpus / spec.gpus_per_node)
        ends_at = None if duration_s is None else c.time + duration_s
        grant = Grant(grant_id, project, pool, gpus, ends_at)
        grant.nodes = [c.add_node(pool).name for _ in range(nodes)]
        c.counters["nodes_added"] += nodes
        self.grants[grant_id] = grant
        log.info("grant %s: %d GPUs for %s in %s on %s", grant_id, gpus, project, pool, grant.nodes)
        return grant

    def release(self, grant_id: str) -> dict[str, object]:
        """End a grant: the quota drops back and exactly the grant's nodes go, every job on
        them (of any project) requeued with compensation. Released before: ``{}``."""
        c = self.cluster
        grant = self.grants.get(grant_id)
        if grant is None:
            if grant_id in self.ended_grants:
                return {}
            raise NotFound(f"no grant {grant_id!r}; active grants: {sorted(self.grants)}")
        requeued: list[str] = []
        for name in grant.nodes:
            node = c.nodes.get(name)
            if node is None:
                continue
            for jid in sorted(node.job_ids()):
                self.preempt(c.jobs[jid])
                requeued.append(jid)
            del c.nodes[name]
        del self.grants[grant_id]
        self.ended_grants[grant_id] = grant
        left = [n for n in grant.nodes if n in c.nodes]
        if left:  # cannot happen: every node was deleted above; never report success with one
            raise Conflict(f"grant {grant_id}: nodes {left} are still in the fleet")
        log.info("grant %s ended: removed %s, requeued %s", grant_id, grant.nodes, requeued)
        return {
            "grant": grant_id,
            "project": grant.project,
            "removed": grant.nodes,
            "requeued": requeued,
        }

    def expire(self) -> list[str]:
        """End grants whose time is over; returns their ids."""
        now = self.cluster.time
        due = [g.id for g in self.grants.values() if g.ends_at is not None and g.ends_at <= now]
        for grant_id in due:
            self.release(grant_id)
        return due

    # --- holds ------------------------------------------------------------------------------

    def hold(self, priority_class: str) -> bool:
        """Keep queued jobs of ``priority_class`` from starting; False when already held."""
        pc = self.cluster.priority_class(priority_class)
        if not pc.holdable:
            raise Conflict(f"priority class {priority_class!r} is not holdable")
        if priority_class in self.held:
            return False
        self.held.add(priority_class)
        self.held_at[priority_class] = self.cluster.time
        return True

    def unhold(self, priority_class: str) -> bool:
        """Let queued jobs of ``priority_class`` start again; False when not held. The time
        held is not a wait for GPUs (``Job.waiting_since`` moves forward by it; a job queued
        during the hold starts waiting now): five hours held are no reason for a fallback
        pool's power-up, or a slice taken back, the moment the hold ends."""
        c = self.cluster
        c.priority_class(priority_class)
        if priority_class not in self.held:
            return False
        self.held.discard(priority_class)
        began = self.held_at.pop(priority_class, c.time)
        for q in c.queues.values():
            for j in q:
                job = c.jobs[j]
                if job.priority_class == priority_class:
                    since = job.waiting_since if job.waiting_since is not None else job.submitted_at
                    job.waiting_since = since + c.time - max(began, since)
        return True

    # --- lending ----------------------------------------------------------------------------

    def lend(self, pool: str) -> bool:
        """Let other projects' jobs borrow the idle reserved GPUs of ``pool`` (their owner
        preempts them when it needs them back); False when it lends already."""
        self.cluster.pool(pool)
        if pool in self.lending:
            return False
        self.lending.add(pool)
        return True

    def unlend(self, pool: str) -> bool:
        """Stop lending ``pool``'s reserved GPUs: no new borrowed job starts there (running
        ones go on until their owner reclaims them or they finish)."""
        self.cluster.pool(pool)
        if pool not in self.lending:
            return False
        self.lending.discard(pool)
        return True
