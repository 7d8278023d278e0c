"""Elastic quota: grants that raise a project's quota in a pool for a while, with the nodes
that hold the GPUs granted.

Owned by ``gpuops.sim.fleet.scheduler`` and called with the cluster lock held: ``grant`` and
``release`` by the ``grant_quota`` and ``release_quota`` operations
(``gpuops.sim.fleet.operations``), ``expire`` at every cluster step. The grants themselves are
in the quota ledger (``gpuops.sim.fleet.quotas``), which counts them in the quotas.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuops.sim.fleet.errors import BadRequest, Conflict, NotFound
from gpuops.sim.fleet.preemption import Preemption
from gpuops.sim.fleet.quotas import Grant, QuotaLedger

if TYPE_CHECKING:
    from gpuops.sim.fleet.cluster import Cluster

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GrantEnded:
    """What ending a grant did: the nodes removed and the jobs requeued from them."""

    grant: str
    project: str
    removed: list[str]
    requeued: list[str]

    def to_json(self) -> dict[str, object]:
        return {
            "grant": self.grant,
            "project": self.project,
            "removed": self.removed,
            "requeued": self.requeued,
        }


class Grants:
    """Grants given, released and expired."""

    def __init__(self, cluster: Cluster, ledger: QuotaLedger, preemption: Preemption) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.preemption = preemption

    def grant(
        self, grant_id: str, project: str, pool: str, gpus: int, duration_s: float | None
    ) -> Grant:
        """Raise ``project``'s quota in ``pool`` by ``gpus`` for ``duration_s`` and add the nodes
        that hold them; a grant id seen before returns that grant unchanged."""
        c = self.cluster
        grants = self.ledger.grants
        if grant_id in grants:
            return grants[grant_id]
        if grant_id in self.ledger.ended_grants:
            raise Conflict(f"grant {grant_id!r} already ended; a new grant needs a new id")
        spec = c.pool(pool)
        if not 1 <= gpus <= 64 * spec.gpus_per_node:
            raise BadRequest(f"gpus must be within [1, {64 * spec.gpus_per_node}], got {gpus}")
        if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
            raise BadRequest(f"duration_s must be a finite number > 0, got {duration_s}")
        nodes = math.ceil(gpus / spec.gpus_per_node)
        ends_at = None if duration_s is None else c.time + duration_s
        grant = Grant(grant_id, project, pool, gpus, ends_at)
        grant.nodes = [c.add_node(pool, granted=True).name for _ in range(nodes)]
        c.counters["nodes_added"] += nodes
        grants[grant_id] = grant
        log.info("grant %s: %d GPUs for %s in %s on %s", grant_id, gpus, project, pool, grant.nodes)
        return grant

    def release(self, grant_id: str) -> GrantEnded | None:
        """End a grant: the quota drops back and exactly the grant's nodes go, every job on
        them (of any project) requeued with compensation. Released before: None."""
        c = self.cluster
        grant = self.ledger.grants.get(grant_id)
        if grant is None:
            if grant_id in self.ledger.ended_grants:
                return None
            raise NotFound(f"no grant {grant_id!r}; active grants: {sorted(self.ledger.grants)}")
        requeued: list[str] = []
        for name in grant.nodes:
            node = c.nodes.get(name)
            if node is None:
                continue
            for jid in sorted(node.job_ids()):
                self.preemption.preempt(c.jobs[jid])
                requeued.append(jid)
            del c.nodes[name]
        del self.ledger.grants[grant_id]
        self.ledger.ended_grants[grant_id] = grant
        left = [n for n in grant.nodes if n in c.nodes]
        if left:  # cannot happen: every node was deleted above; never report success with one
            raise Conflict(f"grant {grant_id}: nodes {left} are still in the fleet")
        log.info("grant %s ended: removed %s, requeued %s", grant_id, grant.nodes, requeued)
        return GrantEnded(grant_id, grant.project, grant.nodes, requeued)

    def expire(self) -> list[str]:
        """End grants whose time is over; returns their ids."""
        now = self.cluster.time
        due = [
            g.id for g in self.ledger.grants.values() if g.ends_at is not None and g.ends_at <= now
        ]
        for grant_id in due:
            self.release(grant_id)
        return due
