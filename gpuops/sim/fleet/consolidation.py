"""Consolidation plans: where the jobs of a partly used node would go so that the node
empties and can be powered down (``consolidate``).

Owned by ``gpuops.sim.fleet.scheduler`` (``Scheduler.drain_plan``) and called with the cluster
lock held: by ``consolidate`` (``gpuops.sim.fleet.operations``), which carries a plan out, and
by the fleet reading (``gpuops.sim.fleet.readings``), which makes the plans of every up node
together (``Claim``) to say which nodes are drainable. A plan moves nothing: it is a list of
``Move``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuops.sim.fleet.errors import Conflict
from gpuops.sim.fleet.model import CULLED_PROFILES, SESSION_IDLE_S, SESSION_PROFILES, Gpu, Job, Node
from gpuops.sim.fleet.quotas import Admission, Key, QuotaLedger
from gpuops.sim.fleet.sharing import fits

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster


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


class Consolidation:
    """Plans that empty a node onto others, as the scheduler would admit the moved jobs."""

    def __init__(self, cluster: Cluster, ledger: QuotaLedger, held: set[str]) -> None:
        self.cluster = cluster
        self.settings = cluster.config.scheduler
        self.ledger = ledger
        self.held = held
        """Held priority classes (``Scheduler.hold``): their queued jobs wait for no pool."""

    def drain_plan(self, node: Node, claim: Claim | None = None) -> list[Move]:
        """Where each job on ``node`` would go so that the node empties (``consolidate``): a
        free GPU (or a slice of a shared GPU, for a job on slices) of another schedulable node
        that runs jobs already, in the node's pool or in another of the job's pools (its
        class's models, never a fallback pool: ``_move_pools``), the fullest first (best fit,
        as the scheduler places) in the first of those pools in the job's order that has room
        (for a job on slices, free slices of GPUs shared already before a free GPU), never an
        idle node (the move would power nothing down), a node being drained, of a quota grant
        or in ``claim.nodes``. In another pool the job goes only as the scheduler would admit
        it there without borrowing (its project's quota, or unreserved GPUs: ``_admits_move``)
        and only where no queued job waits for that pool (its free GPUs are theirs); in its own
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
        if any(node.name in g.nodes for g in self.ledger.grants.values()):
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
        mine.nodes.update(n for g in self.ledger.grants.values() for n in g.nodes)
        jobs = sorted((c.jobs[j] for j in node.job_ids()), key=lambda j: (-j.gpus, j.id))
        admission = Admission(self.ledger, self.held)
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
        project's quota there) or shared (unreserved GPUs), never borrowed
        (``QuotaLedger.kind``), beside what earlier moves of the pass took there
        (``claim.quota``), and no queued job waits for ``pool``."""
        if pool in a.waited_for:
            return False
        key = (job.project, pool)
        guaranteed, shared = a.usage
        taken = {key: guaranteed[key] + claim.quota.get(key, 0.0)}
        others = {pool: shared[pool] + claim.quota.get(("", pool), 0.0)}
        w = self.ledger.weight(job, pool)
        kind = self.ledger.kind(job, pool, taken, others, a.capacity, a.reserved_in, w, lend=False)
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
            w = self.ledger.weight(job, pool)
            for key in ((job.project, pool), ("", pool)):
                claim.quota[key] = claim.quota.get(key, 0.0) + w
            move.borrowed = False
        for g in move.gpus:
            if move.shared:
                claim.slices.setdefault(g.uuid, []).append(c.job_bytes(job, g))
            else:
                claim.whole.add(g.uuid)
        return move
