"""Slices: where a shareable job may run on free slices of shared GPUs, and its owner taking
them back.

Owned by ``gpuops.sim.fleet.scheduler`` and called with the cluster lock held: by its pass
(``Scheduler.run`` places a shareable job on slices before whole GPUs), by ``pack``
(``gpuops.sim.fleet.operations``) and by the fleet reading (``gpuops.sim.fleet.readings``:
which GPUs a pack would share). A shareable job (its job class says so) goes on free slices
of GPUs that are shared already (``pack`` made them so), in any of its pools, before whole
GPUs; a slice counts ``1/slices`` GPU of its quota. With ``SchedulerSettings.slice_borrowing``
it may borrow free slices of GPUs other projects reserve (a light job of one team beside
another's), and the owner preempts it when it needs them back (``reclaim_slice``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.sim.fleet.config import GPU_MODELS
from gpuops.sim.fleet.model import Gpu, Job, Node
from gpuops.sim.fleet.preemption import Preemption, lost_work, reclaimable
from gpuops.sim.fleet.quotas import Admission, Kind, QuotaLedger, Shared, SliceSizes, Usage
from gpuops.sim.fleet.sharing import fits

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster


class Slices:
    """Admissions and placements on slices of shared GPUs."""

    def __init__(self, cluster: Cluster, ledger: QuotaLedger, preemption: Preemption) -> None:
        self.cluster = cluster
        self.settings = cluster.config.scheduler
        self.ledger = ledger
        self.preemption = preemption

    def restarted_lately(self, job: Job) -> bool:
        """Stopped and started again (preempted, packed, moved) within ``move_interval``: such
        a job borrows no slice, so that one the owner took a slice back from runs where it
        may stay, not on the next lent slice that will be taken back too (ping-pong)."""
        moved = job.moved_at
        return moved is not None and self.cluster.time - moved < self.settings.move_interval_s

    def admits_on_slices(self, job: Job, pool: str, a: Admission | None = None) -> Kind | None:
        """How ``job``'s project may run it on slices of ``pool`` — ``guaranteed`` (its quota
        there), ``shared`` (unreserved GPUs), ``borrowed`` (others' reserved GPUs, with
        ``slice_borrowing``: preempted when the owner needs them) — or None, not counting
        what it holds now: the admission ``on_slices`` makes, for ``pack``. ``a``: read once
        by a caller asking for many jobs that hold no GPU of ``pool`` (then what they hold
        counts in no pool asked)."""
        spec = self.cluster.pools[pool]
        if spec.sharing is None:
            return None
        if a is None:
            guaranteed, shared = self.ledger.usage(exclude=job.id)
            capacity, reserved_in = self.ledger.capacity(), self.ledger.reserved_in()
        else:
            (guaranteed, shared), capacity, reserved_in = a.usage, a.capacity, a.reserved_in
        w = job.gpus / spec.slices
        return self.slice_kind(job, pool, guaranteed, shared, capacity, reserved_in, w)

    def pack_target(
        self, job: Job, node: Node, a: Admission | None = None
    ) -> tuple[Kind, tuple[Node, list[Gpu]]] | None:
        """Where ``pack`` would move ``job``, held whole on ``node``, now: (its admission,
        ``admits_on_slices``; the node and GPUs, ``slices_for``) in the first of its pools that
        admits it on slices and has GPUs shared already with a free slice for it, on another
        node. None when none has, or the job was moved within ``move_interval`` (then it is
        only shared in place, no ping-pong with ``consolidate``). ``a``: as for
        ``admits_on_slices``, for a job on a pool that cannot share."""
        if self.restarted_lately(job):
            return None
        for pool in job.pools or (job.pool,):
            kind = self.admits_on_slices(job, pool, a)
            if kind is None:
                continue  # its quota or the pool's reservations do not let it run there
            target = self.slices_for(job, pool, exclude=node.name)
            if target is not None:
                return kind, target
        return None

    def ever_admits_on_slices(self, job: Job, pool: str, sizes: SliceSizes | None = None) -> bool:
        """Whether ``job``'s project may run it on slices of ``pool`` at all, whatever is in
        use now: its quota there, unreserved GPUs at the pool's full size (``max_nodes``), or
        other projects' slices where the fleet lends them (``shares_elsewhere``).
        ``sizes``: ``QuotaLedger.slice_sizes()``, read once by a caller that asks for many
        jobs."""
        full_size, reserved_in = sizes or self.ledger.slice_sizes()
        full = full_size[pool]
        reserved = reserved_in.get(pool, 0)
        lends = self.settings.slice_borrowing and reserved > 0 and self.ledger.may_borrow(job)
        return self.ledger.quota(job.project, pool) > 0 or full > reserved or lends

    def fits_a_slice(self, job: Job, pool: str, gpu: Gpu) -> bool:
        """Whether ``job`` fits one slice of ``gpu`` (a MIG slice holds ``1/slices`` of its
        memory; True when ``pool`` cannot share or ``job`` runs on slices already: nothing to
        check): one that does not, ``pack`` refuses to share in place (409), so the sharing
        series leaves its GPU out (with the pack policy repeating, it would be asked again
        every 30 minutes)."""
        c = self.cluster
        spec = c.pools[pool]
        if spec.sharing is None or job.shared:
            return True
        return fits(spec.sharing, [], c.job_bytes(job, gpu), gpu.model.memory_bytes, spec.slices)

    def shares_elsewhere(self, job: Job, sizes: SliceSizes | None = None) -> bool:
        """Whether ``job``, shareable, may go on slices of a pool of its own that can share
        (``pack`` moves it there from a GPU of a pool that cannot, once a slice is free);
        ``sizes``: ``QuotaLedger.slice_sizes()``, read once per fleet reading."""
        c = self.cluster
        if not job.shareable:
            return False
        for pool in job.pools or (job.pool,):
            spec = c.pools[pool]
            if spec.sharing is None or not self.ever_admits_on_slices(job, pool, sizes):
                continue  # else pack could never move it: the GPU neither packed nor capped
            model = GPU_MODELS[spec.model]
            if fits(spec.sharing, [], c.job_bytes_on(job, model), model.memory_bytes, spec.slices):
                return True
        return False

    def slice_kind(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: Shared,
        capacity: dict[str, int],
        reserved_in: dict[str, int],
        w: float,
    ) -> Kind | None:
        kind = self.ledger.kind(job, pool, guaranteed, shared, capacity, reserved_in, w, False)
        if (
            kind is None
            and self.settings.slice_borrowing
            and reserved_in.get(pool, 0) > 0  # an owner to lend them, and to take them back
            and self.ledger.may_borrow(job)
            and not self.restarted_lately(job)
        ):
            return "borrowed"
        return kind

    def on_slices(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: Shared,
        capacity: dict[str, int],
        reserved_in: dict[str, int],
        borrowed: bool,
    ) -> bool:
        """Place ``job`` on free slices of GPUs already shared in ``pool``: within its
        project's quota or on unreserved GPUs, or (``borrowed``, with ``slice_borrowing``)
        borrowed from the owner, who preempts it when it needs the room
        (``Preemption.victims``, ``reclaim_slice``); False when none fit, or when its
        admission there is not the kind asked for (``Scheduler.run`` asks every pool for the
        one, then for the other: no search twice)."""
        spec = self.cluster.pools[pool]
        if spec.sharing is None:
            return False
        w = job.gpus / spec.slices
        kind = self.slice_kind(job, pool, guaranteed, shared, capacity, reserved_in, w)
        if kind is None or (kind == "borrowed") != borrowed:
            return False
        found = self.slices_for(job, pool)
        if found is None:
            return False
        node, gpus = found
        self._start(job, node, gpus, kind, w, guaranteed, shared)
        return True

    def _start(
        self,
        job: Job,
        node: Node,
        gpus: list[Gpu],
        kind: Kind,
        w: float,
        guaranteed: Usage,
        shared: Shared,
    ) -> None:
        pool = node.pool
        self.cluster.queues[job.pool].remove(job.id)
        job.borrowed = kind == "borrowed"
        if kind == "guaranteed":
            guaranteed[(job.project, pool)] += w
        elif kind == "shared":
            shared[pool] += w
        self.cluster.start_shared(job, node, gpus)

    def reclaim_slice(
        self,
        job: Job,
        pool: str,
        guaranteed: Usage,
        shared: Shared,
    ) -> bool:
        """The owner takes back slices: a shareable ``job`` within its project's quota in
        ``pool`` that no free slice takes preempts borrowed tenants of other projects (past
        ``min_runtime``, under ``max_preemptions``) on shared GPUs of one node until it fits
        each of ``job.gpus`` GPUs, the least work lost first; False when no node can, or
        while a machine of the pool powers up for it (``Preemption.awaits_power``): a light
        job's few minutes, against stopping another team's service."""
        c = self.cluster
        spec = c.pools[pool]
        if spec.sharing is None:
            return False
        w = job.gpus / spec.slices
        key = (job.project, pool)
        if guaranteed[key] + w > self.ledger.quota(*key):
            return False  # beyond its quota it has nothing to reclaim
        if self.preemption.awaits_power(job, pool):
            return False  # a machine powering up gives it room within a boot: nobody stops
        sharing = spec.sharing
        stoppable = self.preemption.stoppable

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
                    (t for t in tenants if reclaimable(t, job) and stoppable(t)),
                    key=lambda t: (lost_work(t) * t.gpus, t.id),
                )
                gone: list[Job] = []
                for victim in [None, *victims]:
                    if victim is not None:
                        gone.append(victim)
                    if room(g, tenants, gone):
                        for spared in list(reversed(gone)):  # not needed after all: spared
                            if room(g, tenants, [t for t in gone if t is not spared]):
                                gone.remove(spared)
                        cost = sum(lost_work(v) * v.gpus for v in gone)
                        options.append((cost, g, list(gone)))
                        break
            if len(options) < job.gpus:
                continue
            options.sort(key=lambda o: (o[0], o[1].uuid))
            chosen = options[: job.gpus]
            victims_all: list[Job] = []
            for _cost, _g, vs in chosen:
                victims_all.extend(v for v in vs if v not in victims_all)
            cost = sum(lost_work(v) * v.gpus for v in victims_all)
            if best is None or cost < best[0]:
                best = (cost, node, [g for _c, g, _v in chosen], victims_all)
        if best is None:
            return False
        _cost, node, gpus, victims = best
        for victim in victims:
            self.preemption.preempt(victim, by=job)  # borrowed: counted in no quota (``usage``)
        # within its quota (checked above; preempting borrowers changes no quota's usage)
        self._start(job, node, gpus, "guaranteed", w, guaranteed, shared)
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
