"""Which decision's action touched which jobs: what the what-if attributes a cost to a policy
by (``gpuops.sim.whatif.harm``).

Owned by ``gpuops.sim.fleet.cluster`` (``Cluster.causes``). The control API
(``gpuops.sim.fleet.control``) names the decision whose call it is carrying out
(``Causes.acting``, for the thread that carries it out); the cluster and its operations note
what that call does to jobs: a job stopped (culled, restarted elsewhere, or preempted off
GPUs a decision lent), and a job acted on (shared, its GPU capped, its class held, or started
after waiting while machines of its pools that a decision powered down were still down).
Bookkeeping only, called with the cluster lock held: nothing here changes the fleet.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SCHEDULER = ""
"""The cause of a stop no decision made: the fleet's own scheduler (a priority preemption,
an owner taking back what the fleet's ``borrowing`` lent)."""


@dataclass(frozen=True)
class Stop:
    """Jobs of one priority class stopped one way by one decision (or ``SCHEDULER``)."""

    kind: str
    """``culled`` (a session ended), ``restarted`` (stopped and started again: reclaimed,
    packed elsewhere, consolidated, migrated) or ``preempted``."""
    priority_class: str
    decision: str


@dataclass
class _Down:
    """A machine a decision powered down, and when it came up again (None: still down)."""

    decision: str
    up_at: float | None = None


class Causes:
    """Stops and acts per decision id, for the what-if to name the policies behind them."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.stops: Counter[Stop] = Counter()
        self.acted: dict[str, set[str]] = defaultdict(set)
        """Priority class -> the decisions that acted on jobs of it."""
        self.slowed: dict[str, set[str]] = defaultdict(set)
        """Priority class -> the decisions that made jobs of it run slower: on slices of a
        GPU they shared, or on a GPU whose clocks they capped."""
        self._down: dict[str, list[_Down]] = defaultdict(list)
        """Pool -> the machines decisions powered down, oldest first (those up again before
        every queued job's wait began forgotten)."""
        self._lent: dict[str, str] = {}
        """Pool -> the last decision that made it lend its idle reserved GPUs (the jobs that
        borrowed there meanwhile may run on after it stops lending)."""
        self._shared: dict[str, str] = {}
        """GPU uuid -> the decision that made it shared."""

    @property
    def decision(self) -> str | None:
        """The decision whose control call this thread is carrying out; None: none."""
        found: str | None = getattr(self._local, "decision", None)
        return found

    @contextmanager
    def acting(self, decision: str | None) -> Iterator[None]:
        """What this thread does meanwhile is ``decision``'s."""
        before = self.decision
        self._local.decision = decision
        try:
            yield
        finally:
            self._local.decision = before

    def stopped(self, kind: str, priority_class: str, decision: str | None = None) -> None:
        """A job of ``priority_class`` stopped ``kind``: by ``decision``, else by the decision
        acting now, else by the fleet's scheduler."""
        cause = decision if decision is not None else (self.decision or SCHEDULER)
        self.stops[Stop(kind, priority_class, cause)] += 1
        if cause != SCHEDULER:
            self.acted[priority_class].add(cause)

    def touched(
        self,
        priority_class: str,
        decisions: Iterable[str] = (),
        slowed: bool = False,
        acting: bool = True,
    ) -> None:
        """Jobs of ``priority_class`` acted on by ``decisions`` and, with ``acting``, by the
        decision acting now; ``slowed``: made to run slower."""
        found = set(decisions)
        if acting and self.decision is not None:
            found.add(self.decision)
        if found:
            self.acted[priority_class].update(found)
            if slowed:
                self.slowed[priority_class].update(found)

    def started(self, priority_class: str, pools: Iterable[str], since: float | None) -> None:
        """A job of ``priority_class`` starts; ``since``: when its wait in the queue began
        (None: it did not wait). Every decision that kept a machine of its ``pools`` powered
        down during that wait acted on it."""
        if since is None:
            return
        down = self._down
        kept = (
            d.decision for p in pools for d in down.get(p, ()) if d.up_at is None or d.up_at > since
        )
        # a job the scheduler places during another decision's call (the pass every call
        # ends with) is not that decision's doing
        self.touched(priority_class, kept, acting=False)

    def started_on_slices(self, priority_class: str, uuids: Iterable[str]) -> None:
        """A job of ``priority_class`` starts on slices of GPUs: the decisions that made them
        shared slow it."""
        shared = (self._shared[u] for u in uuids if u in self._shared)
        self.touched(priority_class, shared, slowed=True, acting=False)

    def made_shared(self, uuids: Iterable[str]) -> None:
        if self.decision is not None:
            for uuid in uuids:
                self._shared[uuid] = self.decision

    def powered_down(self, pool: str) -> None:
        if self.decision is not None:
            self._down[pool].append(_Down(self.decision))

    def powered_up(self, pool: str, now: float, oldest_wait: float) -> None:
        """A machine of ``pool`` powered up at ``now``: the oldest power-down of it still down
        ends; those that ended before ``oldest_wait`` (when the longest wait in the queue
        began) can act on no job any more."""
        down = self._down.get(pool)
        if not down:
            return
        for entry in down:
            if entry.up_at is None:
                entry.up_at = now
                break
        down[:] = [e for e in down if e.up_at is None or e.up_at > oldest_wait]

    def lending(self, pool: str) -> None:
        if self.decision is not None:
            self._lent[pool] = self.decision

    def lent_by(self, pool: str) -> str | None:
        """The last decision that made ``pool`` lend."""
        return self._lent.get(pool)
