"""Preemption: which running jobs may be stopped for another, and what a stop costs them.

Owned by ``gpuops.sim.fleet.scheduler`` and called with the cluster lock held: by its pass
(``Scheduler.run``: room for a guaranteed job, or for a class that ``preempts``), by the
slices' owner taking them back (``gpuops.sim.fleet.slices``) and by a grant's end
(``gpuops.sim.fleet.grants``). A guaranteed job that does not fit preempts borrowed jobs in
its pool (the owner reclaims its quota); a job of a class that ``preempts`` also preempts
lower, preemptible classes. The tenants of a shared GPU go together or not at all: the GPU is
free only without them. Never a job that started less than ``min_runtime_s`` ago or was
preempted ``max_preemptions`` times already.

A preempted job is compensated: requeued at the front of its priority, its lost work (since
its last checkpoint, or all of it without checkpoints) added back to its remaining time and
credited to its project in GPU-seconds (``gpuops_preemption_credit_gpu_seconds_total``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from gpuops.sim.fleet.causes import SCHEDULER
from gpuops.sim.fleet.model import SESSION_PROFILES, Job, Node

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster

log = logging.getLogger(__name__)


def freed(node: Node, jobs: list[Job]) -> int:
    """GPUs of ``node`` that preempting ``jobs`` frees: held whole by one of them, or shared
    by them alone."""
    ids = {j.id for j in jobs}
    return sum(
        1
        for g in node.gpus
        if (g.job is not None and g.job in ids) or (g.tenants and ids.issuperset(g.tenants))
    )


def lost_work(job: Job) -> float:
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


def reclaimable(other: Job, owner: Job) -> bool:
    """``other`` runs on capacity ``owner``'s project lends it (the owner reclaims)."""
    return other.borrowed and other.project != owner.project


class Preemption:
    """Stops jobs for others, with compensation; counts preemptions and credit per project."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.settings = cluster.config.scheduler
        self.preemptions: dict[str, int] = defaultdict(int)
        self.by_class: dict[str, int] = defaultdict(int)
        """Preemptions per priority class (``-``: a job of none)."""
        self.credit_gpu_s: dict[str, float] = defaultdict(float)

    def stoppable(self, job: Job) -> bool:
        """Past ``min_runtime`` since it (re)started and under ``max_preemptions``."""
        s = self.settings
        ran = self.cluster.time - (job.started_at or 0.0)
        return job.preemptions < s.max_preemptions and ran >= s.min_runtime_s

    def awaits_power(self, job: Job, pool: str) -> bool:
        """Whether ``job`` waits for a machine of ``pool`` rather than stop another project's
        job on a lent slice: it has waited less than two boot times (the power-up policy's
        delay, then the boot) since it last entered the queue (``Job.waiting_since``: a job
        preempted off another pool waits afresh, not since its submit hours ago), and a
        machine of the pool boots or one more can be powered up (``Cluster.machines``)."""
        c = self.cluster
        spec = c.pools[pool]
        since = job.waiting_since if job.waiting_since is not None else job.submitted_at
        if c.time - since >= 2 * spec.boot_s:
            return False  # waited long enough, whatever boots (maybe for other jobs)
        nodes = [n for n in c.nodes.values() if n.pool == pool]
        if any(n.booting_until is not None for n in nodes):
            return True
        return len(nodes) < c.machines(pool)

    def victims(self, job: Job, pool: str, reclaim: bool) -> tuple[Node, list[Job]] | None:
        """The node of ``pool`` where preempting the least work makes room for ``job``: jobs
        holding GPUs whole, or every tenant of a shared GPU (a GPU is free only with its last
        tenant gone; tenants on several GPUs free their slices of each)."""
        c = self.cluster
        mine = c.priority_class(job.priority_class)

        def victim(other: Job) -> bool:
            if not self.stoppable(other):
                return False
            theirs = c.priority_class(other.priority_class)
            by_quota = reclaim and reclaimable(other, job)
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
            if free + freed(node, [v for u in units for v in u]) < job.gpus:
                continue
            # the unit adding the least (priority first, then lost work) until enough GPUs are
            # free, counted exactly (a tenant on two GPUs frees both, with their other
            # tenants); then the units not needed after all, latest first, are spared
            picked: list[list[Job]] = []
            while free + freed(node, [v for u in picked for v in u]) < job.gpus:
                taken = {v.id for u in picked for v in u}
                picked.append(
                    min(
                        (u for u in units if u not in picked and any(v.id not in taken for v in u)),
                        key=lambda u: (
                            max(v.priority for v in u if v.id not in taken),
                            sum(lost_work(v) * v.gpus for v in u if v.id not in taken),
                        ),
                    )
                )
            for unit in list(reversed(picked)):
                rest = [u for u in picked if u is not unit]
                if free + freed(node, [v for u in rest for v in u]) >= job.gpus:
                    picked = rest
            chosen: list[Job] = []
            for unit in picked:
                chosen.extend(v for v in unit if v not in chosen)
            cost = sum(lost_work(v) * v.gpus for v in chosen)
            if best is None or cost < best[0]:
                best = (cost, node, chosen)
        return None if best is None else (best[1], best[2])

    def preempt(self, job: Job, by: Job | None = None) -> float:
        """Stop ``job`` and requeue it at the front with its lost work compensated; returns
        the GPU-seconds lost (credited to its project)."""
        c = self.cluster
        lost = lost_work(job)
        # a borrower on GPUs only a decision lent is stopped by that decision; any other
        # preemption is the fleet's own scheduler's, whatever decision's call led to it
        node = c.nodes.get(job.node or "")
        lender = None
        if node is not None and job.borrowed and not self.settings.borrowing:
            lender = c.causes.lent_by(node.pool)
        c.causes.stopped("preempted", job.priority_class, lender or SCHEDULER)
        if job.remaining_s is not None and job.duration_s is not None:
            job.remaining_s = min(job.remaining_s + lost, job.duration_s)
        job.since_checkpoint_s = 0.0
        job.preemptions += 1
        job.front = True
        job.borrowed = False
        job.lost_gpu_s += lost * job.gpus
        job.moved_at = c.time  # restarted: ``pack`` and ``consolidate`` leave it for a while
        self.preemptions[job.project] += 1
        self.by_class[job.priority_class or "-"] += 1
        self.credit_gpu_s[job.project] += lost * job.gpus
        log.debug("%s preempted by %s; %.0f GPU-s lost", job.id, by.id if by else "-", lost)
        c.requeue(job)
        return lost * job.gpus
