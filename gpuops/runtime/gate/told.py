"""The engine's log lines about what it decides and does: one per decision recorded (it runs,
is held, waits for approval, is a dry run, or undoes), one per outcome, and the "nothing
happened" lines (a target held again as before, a clear with nothing to undo) at a level of
their own (``log.quiet_level``).

Each line is a sentence (``gpuops.model.telling``) and carries its fields for the JSON log
format (``gpuops engine run --log-format json``): ``rule.name``, ``gpuops.target.key``,
``event.action``, ``gpuops.verdict``, ``event.reason``, ``gpuops.state``, ``event.outcome``,
``gpuops.effect``, ``gpuops.decision.id``. Written by ``gpuops.runtime.gate.trail.Trail`` once
the audit spool holds what it tells, and by the cycle's commit for the quiet lines.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, Transition
from gpuops.model.telling import (
    doing,
    effect,
    outcome_words,
    state,
    summary,
    verdict_words,
)

log = logging.getLogger(__name__)

FIELDS = "gpuops_fields"
"""The ``LogRecord`` attribute holding a line's fields (read by the CLI's JSON formatter)."""


class Told:
    """Writes the decision and outcome lines; ``quiet_level``: the level of the lines about
    evaluations that changed nothing (default debug: not shown at the default info)."""

    def __init__(self, quiet_level: int = logging.DEBUG) -> None:
        self.quiet_level = quiet_level

    def decision(self, d: Decision) -> None:
        """A decision as recorded and audited (before anything of it runs)."""
        level = logging.WARNING if d.suppressed else logging.INFO
        if not log.isEnabledFor(level):  # the words cost: made only for a line written
            return
        verb = d.action.type if d.action is not None else None
        stands = state(
            d.verdict, has_action=d.action is not None, started=True, outcome=None, verb=verb
        )
        said = summary(d.annotations) if d.transition is Transition.FIRE else ""
        self._line(
            level,
            f"{_head(d)}: {doing(d.transition, verb)} {verdict_words(d.verdict, d.reason)}"
            + (f" — {said}" if said else ""),
            d,
            {"gpuops.state": stands.value},
        )

    def outcome(self, d: Decision, o: Outcome) -> None:
        """The outcome of a decision's action (or its hold at the gate)."""
        if not log.isEnabledFor(logging.INFO if o.ok else logging.WARNING):
            return
        verb = d.action.type if d.action is not None else None
        if o.status is OutcomeStatus.SKIPPED:
            words = verdict_words(d.verdict, d.reason)
            level = logging.WARNING
        else:
            words = outcome_words(o, verb)
            level = logging.INFO if o.ok else logging.WARNING
        stands = state(
            d.verdict, has_action=d.action is not None, started=False, outcome=o, verb=verb
        )
        fields: dict[str, Any] = {
            "gpuops.state": stands.value,
            "event.outcome": o.status.value,
        }
        if o.ok:
            fields["gpuops.effect"] = effect(verb, o.changed).text
        elif o.error:
            fields["error.message"] = o.error
        self._line(level, f"{_head(d)}: {doing(d.transition, verb)} {words}", d, fields)

    def quiet_enabled(self) -> bool:
        """Whether the quiet lines are written now (asked once per commit)."""
        return log.isEnabledFor(self.quiet_level)

    def quiet(self, d: Decision, what: str) -> None:
        """A line about an evaluation that changed nothing (``what`` says how)."""
        self._line(self.quiet_level, f"{_head(d)}: {what}", d, {})

    def _line(self, level: int, text: str, d: Decision, fields: dict[str, Any]) -> None:
        if not log.isEnabledFor(level):
            return
        common: dict[str, Any] = {
            "gpuops.decision.id": d.id,
            "rule.name": d.policy,
            "gpuops.target.key": d.target.key,
            "gpuops.transition": d.transition.value,
            "gpuops.verdict": d.verdict.value,
            "event.reason": d.reason,
        }
        if d.action is not None:
            common["event.action"] = d.action.type
        log.log(level, "%s [decision %s]", text, d.id, extra={FIELDS: common | fields})


def _head(d: Decision) -> str:
    return f"{d.policy} on {d.target.key or '(no target)'}"
