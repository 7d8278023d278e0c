"""The fleet's scheduler: priority classes, GPU-model affinity with fallback, memory fit,
project quotas with borrowing, preemption with compensation, elastic quota grants, and holds.

Owned by ``exporters.fleet.cluster`` (one per cluster) and called with the cluster lock held:
``run`` after anything that frees or adds GPUs or jobs, ``grant``/``release`` and
``hold``/``unhold`` from ``exporters.fleet.operations``. The model:

- A project's *quota* in a pool is its reserved GPUs plus its active grants. A job within its
  project's quota is *guaranteed*; beyond it, it uses the pool's unreserved GPUs (*shared*) or,
  when ``SchedulerSettings.borrowing`` is on, idle GPUs reserved by others (*borrowed*).
- A guaranteed job that does not fit preempts borrowed jobs in its pool (the owner reclaims
  its quota); a job of a class that ``preempts`` also preempts lower, preemptible classes.
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
from typing import TYPE_CHECKING

from exporters.fleet.errors import BadRequest, Conflict, NotFound
from exporters.fleet.model import Job, Node

if TYPE_CHECKING:
    from exporters.fleet.cluster import Cluster

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(project, pool)"""


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

    def _capacity(self) -> dict[str, int]:
        cap: dict[str, int] = dict.fromkeys(self.cluster.pools, 0)
        for node in self.cluster.nodes.values():
            if node.schedulable:
                cap[node.pool] += len(node.gpus)
        return cap

    def _usage(self) -> tuple[dict[Key, int], dict[str, int]]:
        """GPUs of guaranteed jobs per (project, pool), and of shared jobs per pool."""
        guaranteed: dict[Key, int] = defaultdict(int)
        shared: dict[str, int] = defaultdict(int)
        for job in self.cluster.jobs.values():
            if job.state != "running" or job.borrowed:
                continue
            node = self.cluster.nodes.get(job.node or "")
            if node is None:
                continue
            key = (job.project, node.pool)
            if guaranteed[key] + job.gpus <= self.quota(*key):
                guaranteed[key] += job.gpus
            else:
                shared[node.pool] += job.gpus
        return guaranteed, shared

    def demand(self) -> dict[str, int]:
        """Queued jobs (not held) that one more node could place, by the first of their pools
        that has machines left to power up (``max_nodes``) and would admit them there (their
        project's quota, or unreserved GPUs of the pool at full size): the signal a power-up or
        scale-out policy acts on, as a cluster autoscaler's expander picks a node group."""
        c = self.cluster
        out = dict.fromkeys(c.pools, 0)
        queued = [c.jobs[j] for q in c.queues.values() for j in q]
        if not queued:
            return out
        guaranteed, shared = self._usage()
        present: dict[str, int] = dict.fromkeys(c.pools, 0)
        for n in c.nodes.values():
            present[n.pool] += 1
        full = {
            name: (spec.max_nodes if spec.max_nodes is not None else present[name])
            * spec.gpus_per_node
            for name, spec in c.pools.items()
        }
        reserved_in = dict.fromkeys(c.pools, 0)
        for (_project, pool), gpus in self.quotas().items():
            reserved_in[pool] = reserved_in.get(pool, 0) + gpus
        for job in queued:
            if job.priority_class in self.held:
                continue
            for pool in job.pools or (job.pool,):
                spec = c.pools[pool]
                if spec.max_nodes is None or present[pool] >= spec.max_nodes:
                    continue
                if job.gpus > spec.gpus_per_node:
                    continue
                if self._kind(job, pool, guaranteed, shared, full, reserved_in) is not None:
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
        queued.sort(key=lambda j: (-j.priority, not j.front, j.submitted_at))
        guaranteed, shared = self._usage()
        capacity = self._capacity()
        reserved_in = {pool: 0 for pool in c.pools}
        for (_project, pool), gpus in self.quotas().items():
            reserved_in[pool] = reserved_in.get(pool, 0) + gpus
        free = {pool: 0 for pool in c.pools}
        for n in c.nodes.values():
            if n.schedulable:
                free[n.pool] += len(n.free_gpus())
        preempt_budget = 16  # attempts per pass: keeps a pass bounded on a long queue
        for job in queued:
            if job.priority_class in self.held:
                continue
            placed = False
            for pool in job.pools or (job.pool,):
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
            for pool in job.pools or (job.pool,):
                kind = self._kind(job, pool, guaranteed, shared, capacity, reserved_in)
                may_reclaim = kind == "guaranteed"
                if not may_reclaim and not c.priority_class(job.priority_class).preempts:
                    continue
                found = self._victims(job, pool, may_reclaim)
                if found is None:
                    continue
                target, victims = found
                for victim in victims:
                    self._undo_usage(victim, guaranteed, shared)
                    self.preempt(victim, by=job)
                if kind is None:  # room made by priority: it runs as borrowed capacity
                    kind = "borrowed" if self.settings.borrowing else "shared"
                self._place(job, target, kind, guaranteed, shared)
                free[pool] += sum(v.gpus for v in victims) - job.gpus
                break

    def _kind(
        self,
        job: Job,
        pool: str,
        guaranteed: dict[Key, int],
        shared: dict[str, int],
        capacity: dict[str, int],
        reserved_in: dict[str, int],
    ) -> str | None:
        key = (job.project, pool)
        if guaranteed[key] + job.gpus <= self.quota(*key):
            return "guaranteed"
        unreserved = max(capacity.get(pool, 0) - reserved_in.get(pool, 0), 0)
        if shared[pool] + job.gpus <= unreserved:
            return "shared"
        return "borrowed" if self.settings.borrowing else None

    def _place(
        self, job: Job, node: Node, kind: str, guaranteed: dict[Key, int], shared: dict[str, int]
    ) -> None:
        c = self.cluster
        c.queues[job.pool].remove(job.id)
        job.borrowed = kind == "borrowed"
        if kind == "guaranteed":
            guaranteed[(job.project, node.pool)] += job.gpus
        elif kind == "shared":
            shared[node.pool] += job.gpus
        c.start(job, node, node.free_gpus()[: job.gpus])

    def _undo_usage(self, job: Job, guaranteed: dict[Key, int], shared: dict[str, int]) -> None:
        node = self.cluster.nodes.get(job.node or "")
        if node is None or job.borrowed:
            return
        key = (job.project, node.pool)
        if shared[node.pool] >= job.gpus:
            shared[node.pool] -= job.gpus
        else:
            guaranteed[key] = max(guaranteed[key] - job.gpus, 0)

    def _victims(self, job: Job, pool: str, reclaim: bool) -> tuple[Node, list[Job]] | None:
        """The node of ``pool`` where preempting the least work makes room for ``job``."""
        c = self.cluster
        s = self.settings
        mine = c.priority_class(job.priority_class)
        best: tuple[float, Node, list[Job]] | None = None
        for node in c.nodes.values():
            if node.pool != pool or not node.schedulable:
                continue
            free = len(node.free_gpus())
            candidates: list[Job] = []
            for jid in {g.job for g in node.gpus if g.job is not None}:
                other = c.jobs[jid]
                if other.preemptions >= s.max_preemptions:
                    continue
                if c.time - (other.started_at or 0.0) < s.min_runtime_s:
                    continue
                theirs = c.priority_class(other.priority_class)
                by_quota = reclaim and other.borrowed and other.project != job.project
                by_priority = mine.preempts and theirs.preemptible and other.priority < job.priority
                if by_quota or by_priority:
                    candidates.append(other)
            if free + sum(v.gpus for v in candidates) < job.gpus:
                continue
            candidates.sort(key=lambda v: (v.priority, self._lost_work(v) * v.gpus))
            chosen: list[Job] = []
            for victim in candidates:
                if free >= job.gpus:
                    break
                chosen.append(victim)
                free += victim.gpus
            cost = sum(self._lost_work(v) * v.gpus for v in chosen)
            if best is None or cost < best[0]:
                best = (cost, node, chosen)
        return None if best is None else (best[1], best[2])

    @staticmethod
    def _lost_work(job: Job) -> float:
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
        self.preemptions[job.project] += 1
        self.credit_gpu_s[job.project] += lost * job.gpus
        log.debug("%s preempted by %s; %.0f GPU-s lost", job.id, by.id if by else "-", lost)
        c.requeue(job)
        return lost * job.gpus

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
            for jid in sorted({g.job for g in node.gpus if g.job is not None}):
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
        return True

    def unhold(self, priority_class: str) -> bool:
        self.cluster.priority_class(priority_class)
        if priority_class not in self.held:
            return False
        self.held.discard(priority_class)
        return True
