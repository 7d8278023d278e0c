"""Reconciliation: what the state store holds and the audit spool lacks, written to the spool.

A decision is stored before its intent is written, and an outcome before it is audited; a crash,
an unwritable spool or a failed mark in between leaves rows the spool lacks (``audited`` below
their level). ``Reconciler.write_lacking`` writes them in one spool write and marks them, and
names the decisions stored as started whose intent it just wrote (the gate runs those). Called
by ``gpuops.runtime.gate.gate.Gate`` at start (``resume``) and every few seconds while the spool
has a problem (``gpuops.runtime.facade``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gpuops.model.decisions import Decision, Outcome
from gpuops.runtime.gate.trail import Trail
from gpuops.store.interface import Audited, DecisionStatus, Store, StoredDecision

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reconciled:
    """What a reconciliation wrote: how many documents, and the decisions stored as started
    whose intent was among them (not run yet: the gate runs them once)."""

    written: int
    started: tuple[Decision, ...] = ()


class Reconciler:
    """Writes what the spool lacks (call holding the gate's admission lock: one writer of
    intents at a time)."""

    def __init__(self, store: Store, trail: Trail, running: Callable[[], Collection[str]]) -> None:
        """``running``: the ids of the actions in the gate's hands now (their outcomes are
        their workers' to write)."""
        self._store = store
        self._trail = trail
        self._running = running

    def write_lacking(self) -> Reconciled | None:
        """Write the intents and outcomes the spool lacks; None when the spool still refuses
        them (``Trail.problem`` stays)."""
        rows = self._store.unaudited()
        lacking = self._outcomes_lacking(rows)
        entries: list[tuple[Decision, Outcome | None]] = []
        intents: list[str] = []
        outcomes: list[str] = []
        started: list[Decision] = []
        for stored in rows:
            decision = stored.decision
            if stored.audited < Audited.INTENT:
                entries.append((decision, None))
                intents.append(decision.id)
                if stored.status is DecisionStatus.STARTED:
                    started.append(decision)
            if stored.outcome is not None and decision.id in lacking:
                entries.append((decision, stored.outcome))
                outcomes.append(decision.id)
        if not entries:  # nothing waits for the spool (the next write tells if it is full)
            if self._trail.problem is not None:
                self._trail.wrote()
            return Reconciled(0)
        if not self._trail.write("reconciliation", entries):
            return None
        self._store.mark_audited(intents, Audited.INTENT)
        self._store.mark_audited(outcomes, Audited.OUTCOME)
        self._trail.wrote()
        log.warning(
            "audit reconciled: %d intents and %d outcomes the spool lacked written",
            len(intents),
            len(outcomes),
        )
        return Reconciled(len(entries), tuple(started))

    def _outcomes_lacking(self, rows: Sequence[StoredDecision]) -> set[str]:
        """The ids among ``rows`` (just read) whose stored outcome the spool lacks and no worker
        of the gate is about to write: an action still running (its outcome waiting in the
        outcome batch) writes and marks its own, so reconciliation writing it too would leave
        two copies in the spool. Its worker marks the outcome audited before it leaves the
        running set, so what is not running now is read again: written and marked meanwhile,
        or lacking for good (a failed write or mark, a previous run's)."""
        running = set(self._running())  # after the rows were read: see the docstring
        idle = [s.id for s in rows if s.outcome is not None and s.id not in running]
        if not idle:
            return set()
        return {s.id for s in self._store.unaudited(idle) if s.outcome is not None}
