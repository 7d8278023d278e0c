"""The gate's worker pools: one per (executor, lane), so that one slow receiver delays only its
own actions, and a bounded number of them, whatever label values name lanes.

An executor names the lane of a decision (``gpuops.actions.base.lane``: the webhook's receiver,
the node agent's origin); ``gpuops.runtime.gate.gate.Gate`` takes the pool of that lane for
each action it queues and releases it when the action is done.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

LANES_PER_EXECUTOR = 16
"""Lanes with workers of their own per executor (webhook: receivers). Enough for the receivers
a team runs; a host templated from labels (one lane per node) cannot make threads without end."""

PoolKey = tuple[str, str]
"""A pool's key: executor name and lane (``""``: the executor's shared pool)."""


class Lanes:
    """The worker pools, one per (executor, lane), ``workers`` threads each. An executor has at
    most ``cap`` lanes of its own at a time: a new lane takes the place of one with nothing
    queued or running (its threads end); while all ``cap`` are busy, the actions of a new lane
    run on the executor's shared pool (lane ``""``, also the one pool of an executor that names
    no lanes). So an executor has at most ``(cap + 1) * workers`` threads, whatever label
    values name lanes. Not locked itself: the gate calls it holding its lock."""

    def __init__(self, workers: int, cap: int) -> None:
        self._workers = workers
        self._cap = cap
        self._pools: dict[PoolKey, ThreadPoolExecutor] = {}
        self._load: dict[PoolKey, int] = {}  # actions queued or running, per pool
        self._shared: set[str] = set()  # executors whose new lanes now run on their "" pool
        self._made = 0

    def take(self, executor: str, lane: str) -> tuple[PoolKey, ThreadPoolExecutor]:
        """The pool an action of ``lane`` on ``executor`` runs on, busy until ``release``."""
        key = self._place(executor, lane)
        pool = self._pools.get(key)
        if pool is None:
            self._made += 1
            pool = ThreadPoolExecutor(
                self._workers, thread_name_prefix=f"gpuops-{executor}-{self._made}"
            )
            self._pools[key] = pool
        self._load[key] = self._load.get(key, 0) + 1
        return key, pool

    def release(self, key: PoolKey) -> None:
        self._load[key] -= 1

    def _place(self, executor: str, lane: str) -> PoolKey:
        key = (executor, lane)
        if not lane or key in self._pools:
            return key
        own = [k for k in self._pools if k[0] == executor and k[1]]
        if len(own) >= self._cap:
            idle = next((k for k in own if not self._load.get(k)), None)
            if idle is None:
                if executor not in self._shared:
                    self._shared.add(executor)
                    log.warning(
                        "executor %s: all %d lanes busy; new lanes share %d workers until one "
                        "is idle",
                        executor,
                        self._cap,
                        self._workers,
                    )
                return (executor, "")
            self._pools.pop(idle).shutdown(wait=False)
            del self._load[idle]
        self._shared.discard(executor)
        return key

    def pools(self) -> list[ThreadPoolExecutor]:
        return list(self._pools.values())
