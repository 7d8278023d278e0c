"""Bounds on utilization over powered GPUs: the fewest GPUs that could hold the jobs running
at one observation, in their pools and in any pool they may use.

Used by ``gpuops.sim.fleet.report.recorder`` at every observation (``Fewest.hold`` for every
job on every GPU it counts, with the cluster lock held); the sums become
``RunReport.utilization_bound_pools`` and ``utilization_bound_any_pool``.
"""

from __future__ import annotations

import math
from collections import defaultdict

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import GPU_MODELS
from gpuops.sim.fleet.model import Gpu, Job


class Fewest:
    """The fewest GPUs that could hold the jobs running at one observation, two ways
    (``Recorder.observe`` calls ``hold`` for every job on every GPU it counts, with the cluster
    lock held); utilization over them is the most that any placement and power management of
    the same jobs, each at the load it has now, could reach (``RunReport.
    utilization_bound_pools``, ``utilization_bound_any_pool``). "At the load it has now": no
    GPU asked for more than it has (time-slicing admits more, the jobs then slow down and the
    GPU reads 100 %) and no job's load changed by its place (a MIG slice caps it); a placement
    that changes loads is outside what these figures bound.

    A job that cannot share needs the GPUs it holds whole. Shareable jobs need at least what
    their memory, their slices (one each per GPU they use) and their load (a shared GPU's load
    divided among its jobs) need, each as shares of one GPU (``Bins``).

    - *pools*: each pool holds the jobs running in it now, and powers whole nodes: the pool's
      GPUs needed, rounded up to its nodes' size (no powered node without a job, no job
      moved to another pool);
    - *any pool*: every shareable job counted against the roomiest GPU (most memory, most
      slices) of the pools it may run in, all of them together, and no node rounding: a
      relaxation.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.whole: dict[str, int] = defaultdict(int)
        self.shares: dict[str, Bins] = defaultdict(Bins)
        self.alone = 0
        self.anywhere = Bins()
        self._roomiest: dict[tuple[str, ...], tuple[int, int]] = {}
        """Pools a job may run in (its own pool last) -> (most memory, most slices)."""

    def hold(self, pool: str, gpu: Gpu, job: Job, holders: int) -> None:
        """Count ``job`` on ``gpu`` of ``pool``, shared by ``holders`` jobs (1: whole)."""
        if not job.shareable:
            self.whole[pool] += 1
            self.alone += 1
            return
        c = self.cluster
        spec = c.pools[pool]
        load = gpu.utilization / holders
        used = c.job_bytes(job, gpu)
        if spec.slices > 1:  # a share over 1 (memory_gib beyond the GPU) counts as 1
            here = min(used / gpu.model.memory_bytes, 1.0)
            self.shares[pool].add(here, 1.0 / spec.slices, load)
        else:
            self.whole[pool] += 1
        may = (*(job.pools or (job.pool,)), pool)
        roomiest = self._roomiest.get(may)
        if roomiest is None:
            specs = [c.pools[p] for p in may]
            memory = max(GPU_MODELS[m.model].memory_bytes for m in specs)
            roomiest = self._roomiest[may] = (memory, max(m.slices for m in specs))
        self.anywhere.add(min(used / roomiest[0], 1.0), 1.0 / roomiest[1], load)

    def gpus(self) -> tuple[dict[str, int], int]:
        """(pool -> GPUs its jobs need, whole nodes), GPUs the jobs need in any pool."""
        in_pools = {}
        for pool in set(self.whole) | set(self.shares):
            gpus = self.whole[pool] + (self.shares[pool].fewest() if pool in self.shares else 0)
            size = self.cluster.pools[pool].gpus_per_node
            in_pools[pool] = -(-gpus // size) * size
        return in_pools, self.alone + self.anywhere.fewest()


class Bins:
    """Shareable jobs as items of a vector bin packing (memory, slices, load; each a share of
    one GPU) and a lower bound on the GPUs that hold them: per dimension, the sum rounded up,
    or the items over half a GPU (no two of them fit one GPU), whichever is more; the most
    over the dimensions."""

    def __init__(self) -> None:
        self.sums = [0.0, 0.0, 0.0]
        self.big = [0, 0, 0]

    def add(self, *item: float) -> None:
        for d, size in enumerate(item):
            self.sums[d] += size
            self.big[d] += size > 0.5 + 1e-9

    def fewest(self) -> int:
        return max(
            max(math.ceil(total - 1e-9) if total > 0 else 0, big)
            for total, big in zip(self.sums, self.big, strict=True)
        )
