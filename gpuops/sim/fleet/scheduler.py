"""The fleet's scheduler: it places queued jobs — priority classes, GPU-model affinity with
fallback, memory fit, project quotas with borrowing, slices of shared GPUs, preemption with
compensation — and holds the classes held back.

Owned by ``gpuops.sim.fleet.cluster`` (one per cluster) and called with the cluster lock held:
``run`` after anything that frees or adds GPUs or jobs, ``grant``/``release``,
``hold``/``unhold`` and ``lend``/``unlend`` from ``gpuops.sim.fleet.operations``. Its parts,
each a module of its own: the quota ledger (``gpuops.sim.fleet.quotas``: what each project may
hold, and how a job is admitted), preemption (``gpuops.sim.fleet.preemption``), slices of
shared GPUs (``gpuops.sim.fleet.slices``), consolidation plans
(``gpuops.sim.fleet.consolidation``) and elastic quota grants (``gpuops.sim.fleet.grants``).
This module is the pass that places jobs (``run``), the demand signals that say what one more
node or a lent pool would start (``demand``, ``borrow_demand``), and holds; the other parts
are reached through the scheduler by the cluster and the operations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.sim.fleet.consolidation import Claim, Consolidation, Move
from gpuops.sim.fleet.errors import Conflict
from gpuops.sim.fleet.grants import GrantEnded, Grants
from gpuops.sim.fleet.model import Gpu, Job, Node
from gpuops.sim.fleet.preemption import Preemption
from gpuops.sim.fleet.quotas import (
    Admission,
    Grant,
    Key,
    Kind,
    QuotaLedger,
    Shared,
    SliceSizes,
    Usage,
)
from gpuops.sim.fleet.slices import Slices

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster


def placing_order(job: Job) -> tuple[int, bool, float]:
    """The order ``Scheduler.run`` places queued jobs in: highest priority first, preempted
    ones before the rest of their priority, then oldest."""
    return (-job.priority, not job.front, job.queued_at or job.submitted_at)


class Scheduler:
    """Places queued jobs; holds quotas, grants and holds. Callers hold the cluster lock."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.settings = cluster.config.scheduler
        self.held: set[str] = set()
        self.held_at: dict[str, float] = {}
        """held priority class -> when its hold began (``unhold`` shifts its jobs' wait)."""
        self.ledger = QuotaLedger(cluster)
        self.preemption = Preemption(cluster)
        self.slices = Slices(cluster, self.ledger, self.preemption)
        self.consolidation = Consolidation(cluster, self.ledger, self.held)
        self.elastic = Grants(cluster, self.ledger, self.preemption)

    # --- what the cluster, the operations and the fleet's readers ask ------------------------

    @property
    def grants(self) -> dict[str, Grant]:
        """Active quota grants by id."""
        return self.ledger.grants

    @property
    def lending(self) -> set[str]:
        """Pools whose idle reserved GPUs other projects may borrow (``lend``)."""
        return self.ledger.lending

    @property
    def preemptions(self) -> dict[str, int]:
        """Project -> jobs of it preempted."""
        return self.preemption.preemptions

    @property
    def credit_gpu_s(self) -> dict[str, float]:
        """Project -> GPU-seconds its preempted jobs lost (compensated)."""
        return self.preemption.credit_gpu_s

    def quota(self, project: str, pool: str) -> int:
        return self.ledger.quota(project, pool)

    def quotas(self) -> dict[Key, int]:
        return self.ledger.quotas()

    def slice_sizes(self) -> SliceSizes:
        return self.ledger.slice_sizes()

    def _usage(self, exclude: str = "") -> tuple[Usage, Shared]:
        return self.ledger.usage(exclude)

    def admission(self) -> Admission:
        """Admissions read once, when first asked, for a caller weighing many."""
        return Admission(self.ledger, self.held)

    def admits_on_slices(self, job: Job, pool: str, a: Admission | None = None) -> Kind | None:
        return self.slices.admits_on_slices(job, pool, a)

    def pack_target(
        self, job: Job, node: Node, a: Admission | None = None
    ) -> tuple[Kind, tuple[Node, list[Gpu]]] | None:
        return self.slices.pack_target(job, node, a)

    def drain_plan(self, node: Node, claim: Claim | None = None) -> list[Move]:
        return self.consolidation.drain_plan(node, claim)

    def preempt(self, job: Job, by: Job | None = None) -> float:
        return self.preemption.preempt(job, by)

    def grant(
        self, grant_id: str, project: str, pool: str, gpus: int, duration_s: float | None
    ) -> Grant:
        return self.elastic.grant(grant_id, project, pool, gpus, duration_s)

    def release(self, grant_id: str) -> GrantEnded | None:
        return self.elastic.release(grant_id)

    def expire(self) -> list[str]:
        return self.elastic.expire()

    # --- demand ------------------------------------------------------------------------------

    def demand(self) -> dict[str, int]:
        """Queued jobs (not held) that one more node could place, by the first of their pools
        that has machines left to power up (``Cluster.machines``: its ``max_nodes``, or the
        nodes it had that are powered down) and would admit them there (their
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
        guaranteed, shared = self.ledger.usage()
        present: dict[str, int] = dict.fromkeys(c.pools, 0)
        booting: dict[str, int] = dict.fromkeys(c.pools, 0)
        for n in c.nodes.values():
            present[n.pool] += 1
            if n.booting_until is not None and not n.failed and not n.drained:
                booting[n.pool] += len(n.gpus)  # a failed or drained one takes nobody
        full = self.ledger.full_size()
        reserved_in = self.ledger.reserved_in()
        # in the order ``run`` places them: the job a booting node is counted for is the one
        # that will get it (a lower priority's, counted first, lost a boot time to a higher)
        queued.sort(key=placing_order)
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
                if self.ledger.kind(job, pool, guaranteed, shared, full, reserved_in) is None:
                    continue
                if booting[pool] >= job.gpus:
                    # a node on its way takes it: no second power-up for it, here or in a
                    # later pool of its list (a pool whose last machine boots is not full for
                    # the job that machine is for)
                    booting[pool] -= job.gpus
                    break
                if present[pool] >= c.machines(pool):
                    continue  # no machine of the pool left to power up
                if own and spec.model not in models and c.time - since < spec.boot_s:
                    # a fallback pool's machine for a job that has waited less than it takes
                    # to boot: GPUs of its own models free up as often as not before it is
                    # ready (the ski-rental break-even again: wait as long as the power-up
                    # costs); powered up at once, most such machines never run a job
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
        guaranteed, shared = self.ledger.usage()
        capacity = self.ledger.capacity()
        reserved_in = self.ledger.reserved_in()
        for job in queued:
            if job.priority_class in self.held:
                continue
            pools = job.pools or (job.pool,)
            if any(
                self.ledger.kind(job, p, guaranteed, shared, capacity, reserved_in, lend=False)
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
        queued.sort(key=placing_order)
        guaranteed, shared = self.ledger.usage()
        capacity = self.ledger.capacity()
        reserved_in = self.ledger.reserved_in()
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
                self.slices.on_slices(
                    job, pool, guaranteed, shared, capacity, reserved_in, borrowed
                )
                for borrowed in (False, True)
                for pool in pools
            )
            for pool in () if placed else pools:
                if free.get(pool, 0) < job.gpus:
                    continue
                kind = self.ledger.kind(job, pool, guaranteed, shared, capacity, reserved_in)
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
                self.slices.reclaim_slice(job, pool, guaranteed, shared) for pool in pools
            ):
                continue
            for pool in pools:
                kind = self.ledger.kind(job, pool, guaranteed, shared, capacity, reserved_in)
                # a light job waiting for a machine powering up stops no borrower here either
                waits = job.shareable and self.preemption.awaits_power(job, pool)
                may_reclaim = kind == "guaranteed" and not waits
                if not may_reclaim and not c.priority_class(job.priority_class).preempts:
                    continue
                found = self.preemption.victims(job, pool, may_reclaim)
                if found is None:
                    continue
                target, victims = found
                for victim in victims:
                    self.preemption.preempt(victim, by=job)
                # counted again, not undone by guess: a victim's share (a slice's, a whole
                # GPU's) left exactly the bucket (guaranteed, shared) ``QuotaLedger.usage``
                # put it in
                guaranteed, shared = self.ledger.usage()
                if kind is None:  # room made by priority: it runs as borrowed capacity
                    kind = "borrowed" if self.ledger.lends(pool) else "shared"
                self._place(job, target, kind, guaranteed, shared)
                # victims on slices free a GPU only with its last tenant: count, not add up
                free[pool] = sum(
                    len(n.free_gpus()) for n in c.nodes.values() if n.pool == pool and n.schedulable
                )
                break

    def _place(self, job: Job, node: Node, kind: Kind, guaranteed: Usage, shared: Shared) -> None:
        c = self.cluster
        c.queues[job.pool].remove(job.id)
        job.borrowed = kind == "borrowed"
        if kind == "guaranteed":
            guaranteed[(job.project, node.pool)] += job.gpus
        elif kind == "shared":
            shared[node.pool] += job.gpus
        c.start(job, node, node.free_gpus()[: job.gpus])

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
        if pool in self.ledger.lending:
            return False
        self.ledger.lending.add(pool)
        return True

    def unlend(self, pool: str) -> bool:
        """Stop lending ``pool``'s reserved GPUs: no new borrowed job starts there (running
        ones go on until their owner reclaims them or they finish)."""
        self.cluster.pool(pool)
        if pool not in self.ledger.lending:
            return False
        self.ledger.lending.discard(pool)
        return True
