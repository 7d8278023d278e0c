"""What the gate writes to the audit spool, and whether the spool takes writes.

Intents are written before anything runs (``write_intents``), outcomes once stored
(``write_outcome``, batched by ``gpuops.runtime.gate.outcomes.OutcomeBatch``), and decisions that
run nothing as they are (``record``). A write the spool refuses (disk full, unwritable) sets
``problem``: no action runs until a write succeeds again (``/healthz`` turns red, a metric counts
it), and ``gpuops.runtime.gate.reconcile`` writes what the spool lacks. Each document written is
then told in the engine's log (``gpuops.runtime.gate.told``) and handed to the decision
listener (the demo's and the tests' window on decisions). Used by
``gpuops.runtime.gate.gate.Gate`` and its reconciliation only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpuops.audit import AuditLog, AuditWriteError
from gpuops.model.decisions import Decision, Outcome
from gpuops.runtime.gate.outcomes import Batch, OutcomeBatch
from gpuops.runtime.gate.told import Told
from gpuops.runtime.metrics import EngineMetrics
from gpuops.store.errors import StateError
from gpuops.store.interface import Audited, Store

log = logging.getLogger(__name__)

DecisionListener = Callable[[Decision, Outcome | None], None]
"""Told of every decision once audited: its intent (outcome None), then its outcome."""


class Trail:
    """The gate's audit writes and the spool's health."""

    def __init__(
        self,
        audit: AuditLog,
        store: Store,
        metrics: EngineMetrics,
        listener: DecisionListener | None,
        told: Told | None = None,
    ) -> None:
        self._audit = audit
        self.told = told or Told()
        self._store = store
        self._metrics = metrics
        self.listener = listener
        self._problem: str | None = None
        self.outcomes = OutcomeBatch(self._write_outcomes)
        metrics.audit_healthy.set(1)

    @property
    def problem(self) -> str | None:
        """Why no action can run now (the audit spool is not writable), or None."""
        return self._problem

    def fail(self, reason: str) -> None:
        """No action runs until reconciliation has written what the spool lacks (a store that
        failed while decisions were admitted: see ``gpuops.runtime.gate.gate.Gate.admit``)."""
        self._problem = reason

    def _failed_write(self, what: str, exc: AuditWriteError, count: int) -> None:
        self._metrics.audit_write_failures.labels(what).inc(count)
        self._metrics.audit_healthy.set(0)
        reason = f"{what} not written to the audit: {exc}"
        if self._problem is None:
            log.error("%s; no action runs until the spool is writable again", reason)
        self._problem = reason

    def wrote(self) -> None:
        if self._problem is not None:
            log.warning("the audit spool is writable again: actions resume")
        self._problem = None
        self._metrics.audit_healthy.set(1)

    def write(self, what: str, entries: Sequence[tuple[Decision, Outcome | None]]) -> bool:
        """Write ``entries`` in one spool write; False (``problem`` says why) when the spool
        refused them."""
        try:
            self._audit.write_ahead(entries)
        except AuditWriteError as exc:
            self._failed_write(what, exc, len(entries))
            return False
        return True

    def write_intents(self, decisions: Sequence[Decision]) -> bool:
        """The intents of ``decisions`` (decision and verdict), fsync'd, in one write; each
        told in the log once written."""
        if not self.write("intent", [(d, None) for d in decisions]):
            return False
        for decision in decisions:
            self.told.decision(decision)
        return True

    def write_outcome(self, decision: Decision, outcome: Outcome) -> None:
        """Audit a stored outcome; returns once it is written (or failed to be). Outcomes that
        finish together share one spool write and one transaction (``OutcomeBatch``)."""
        self.outcomes.write(decision, outcome)

    def _write_outcomes(self, batch: Batch) -> None:
        """One spool write, then one transaction marking them audited, for ``batch``; then
        the listener for each. What fails for the batch (an unwritable spool, a failed mark) is
        logged, and a listener's error for one outcome too, so that no worker of the batch
        skips its outcome hooks for what happened to another (reconciliation writes what the
        spool or the marks lack)."""
        if self.write("outcome", batch):  # not written: stored, ``reconcile`` writes them
            try:
                self._store.mark_audited([d.id for d, _ in batch], Audited.OUTCOME)
            except StateError as exc:  # the spool holds them; reconciliation writes them again
                log.error(  # (the same event ids: the index keeps one copy)
                    "the outcomes of %d actions are in the audit spool but could not be "
                    "marked so: %s",
                    len(batch),
                    exc,
                )
        for decision, outcome in batch:  # each worker's own: one listener error is not theirs
            self.told.outcome(decision, outcome)
            try:
                self.notify(decision, outcome)
            except Exception:  # a collaborator's bug must not skip the others' outcome hooks
                log.exception("decision listener failed for the outcome of %s", decision.id)

    def notify(self, decision: Decision, outcome: Outcome | None) -> None:
        if self.listener is not None:
            self.listener(decision, outcome)

    def record(self, decision: Decision, outcome: Outcome | None = None) -> bool:
        """Audit a decision that runs nothing (a cancelled, denied or expired approval), or a
        runner's step with its outcome; False when the spool refused it (``problem``)."""
        written = self.write("decision", [(decision, outcome)])
        if written:
            if outcome is None:
                self.told.decision(decision)
            else:
                self.told.outcome(decision, outcome)
        self.notify(decision, outcome)
        return written
