"""What an alert decides: a firing alert runs the ``action`` of every policy whose
``trigger.alertmanager`` labels it carries, a resolved one their ``on_clear`` — judged and run
through the cycle's commit and the gate (``gpuops.runtime.alerts.batch``).

Deduplicated by episode: a notification already handled decides nothing, unless its firing was
held back (kill switch, pause, budget), whose next notification decides the next repeat. A
resolve undoes only what ran: one that arrives before its firing, or while the firing's action
runs, is kept in the store (``early_resolves``) and decided once that action has succeeded
(``gpuops.runtime.alerts.inbox.AlertInbox.fire_finished``). Used by the inbox's worker
(``handle_batch``) and by ``gpuops.runtime.facade.Engine.handle_alert`` (``handle``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuops.model.alerts import Alert
from gpuops.model.decisions import Decision, OutcomeStatus, Transition, Verdict, decision_id
from gpuops.model.evaluation.alertmanager import evaluate_alert
from gpuops.model.rules.model import Policy
from gpuops.runtime.alerts.batch import Batch, BatchWriter, Pending, episode_key
from gpuops.runtime.alerts.waiting import Queued
from gpuops.runtime.rulebook import Rulebook
from gpuops.store.interface import DecisionStatus, Store, StoredDecision

log = logging.getLogger(__name__)


class Decider:
    """Decides alerts, one or a batch at a time."""

    def __init__(
        self,
        *,
        store: Store,
        rulebook: Rulebook,
        writer: BatchWriter,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._rulebook = rulebook
        self._writer = writer
        self._clock = clock

    def handle(self, alert: Alert) -> list[Decision]:
        """Decide on one alert (not an inbox item: nothing is counted, an error is raised).
        Ids come from (policy, target, startsAt), so a retried webhook never acts twice."""
        run = Batch(self._clock())
        one = Pending(None, alert, None)
        self._decide(run, one)
        self._writer.store(run)
        if one.error is not None:
            raise one.error
        return one.decided

    def handle_batch(self, batch: Sequence[Queued]) -> None:
        """Dedupe and decide the alerts of ``batch`` in order, then store them together. An
        alert whose decision reads what another of the batch decided (its firing, the same
        episode again) is decided after those are stored, as one after the other would be."""
        run = Batch(self._clock())
        alerts = self._prefetch(run, batch)
        for one in alerts:
            try:
                if one.key in run.keys:
                    self._writer.store(run)
                if self._known(one, run):
                    one.key = None  # recorded already: a duplicate
                    run.alerts.append(one)
                    continue
                self._decide(run, one)
            except Exception as exc:  # one bad alert must not stop the others
                one.error = exc
                if one not in run.alerts:
                    run.alerts.append(one)
        self._writer.store(run)

    def _prefetch(self, run: Batch, batch: Sequence[Queued]) -> list[Pending]:
        """The alerts of ``batch`` with what ``run`` reads about them read at once: which were
        handled already, and the stored decisions their own would repeat or undo (a read
        apiece waited for the state store's lock behind the gate's writes)."""
        alerts = [Pending(item, alert, episode_key(alert)) for item, alert in batch]
        ids: list[str] = []
        for one in alerts:
            try:
                one.candidates = self._candidates(one.alert, run.now)
            except Exception as exc:  # decided (and failing) on its own in ``_decide``
                log.debug("alert %s: %s", one.alert.fingerprint, exc)
                continue
            for _, d in one.candidates:
                ids.append(d.id)
                if d.transition is not Transition.FIRE:
                    ids.append(decision_id(d.policy, d.target.key, d.episode_start, "fire"))
        run.known = self._store.known_alerts([a.key for a in alerts if a.key is not None])
        stored = self._store.stored_decisions(ids)
        run.stored = {i: stored.get(i) for i in ids}
        return alerts

    def _known(self, one: Pending, run: Batch) -> bool:
        """Whether ``one`` was handled already (and is not a firing held back then)."""
        key = one.key
        assert key is not None
        if key not in run.known:
            return False
        return not (one.alert.firing and self._was_held(one, run))

    def _candidates(self, alert: Alert, now: float) -> list[tuple[Policy, Decision]]:
        """What ``alert`` decides for each policy it triggers, before its history is read
        (held fires, resolves with nothing to undo)."""
        episode = alert.episode_start() or now
        found = []
        for policy in self._rulebook.rules.policies():
            decision = evaluate_alert(policy, alert.labels, alert.firing, episode, now)
            if decision is not None:
                found.append((policy, decision))
        return found

    def _decide(self, run: Batch, one: Pending) -> None:
        """Take ``one``'s decisions (stored with ``run``)."""
        if one.candidates is None:
            one.candidates = self._candidates(one.alert, run.now)
        found: list[tuple[Policy, Decision]] = []
        for policy, candidate in one.candidates:
            decision: Decision | None = candidate
            if candidate.transition is Transition.FIRE:
                decision = self._after_holds(candidate, run)
            else:
                decision = self._undo_only_what_ran(candidate, one.alert, run)
            if decision is not None:
                found.append((policy, decision))
        run.add(one, found)

    def _after_holds(self, fire: Decision, run: Batch) -> Decision:
        """The fire to decide now: the episode's first, or — when that one was held back (kill
        switch, pause, budget: at judgement or at the gate) and Alertmanager notifies again —
        the next repeat, a new decision id that is judged and run through the gate like any."""
        while _held(self._writer.stored(run, fire.id)):
            repeat = fire.repeat + 1
            fire = replace(
                fire,
                repeat=repeat,
                id=decision_id(
                    fire.policy, fire.target.key, fire.episode_start, fire.transition, repeat
                ),
            )
        return fire

    def _was_held(self, one: Pending, run: Batch) -> bool:
        """Whether this firing alert's last decision was held back (decided again when
        Alertmanager notifies again, although the notification is known)."""
        if one.candidates is None:
            one.candidates = self._candidates(one.alert, run.now)
        for _, decision in one.candidates:
            after = self._after_holds(decision, run)
            if after.repeat > 0 and self._writer.stored(run, after.id) is None:
                return True
        return False

    def _undo_only_what_ran(self, resolve: Decision, alert: Alert, run: Batch) -> Decision | None:
        """A resolved alert runs on_clear only if its firing alert's action ran and succeeded;
        while that action has not run yet (or its firing has not arrived), the resolve waits
        for it (None: nothing decided now)."""
        fire_id = decision_id(resolve.policy, resolve.target.key, resolve.episode_start, "fire")
        if resolve.id in run.ids:
            self._writer.store(run)
        fire = self._writer.stored(run, fire_id)
        if fire is not None and (
            (fire.outcome is not None and fire.outcome.ok)
            or fire.decision.verdict is Verdict.DRY_RUN
        ):
            return resolve
        if fire is None or fire.status is DecisionStatus.STARTED:
            self._store.save_early_resolve(fire_id, alert, self._clock())
            # the fire may have finished meanwhile: its hook found nothing to take
            fire = run.stored[fire_id] = self._store.decision(fire_id)
            if fire is None or fire.status is DecisionStatus.STARTED:
                log.info(
                    "resolve of %s on %s before its action ran: undoes once it succeeds",
                    resolve.policy,
                    resolve.target.key,
                )
                return None
            self._store.take_early_resolve(fire_id)
            return self._undo_only_what_ran(resolve, alert, run)
        return replace(
            resolve,
            action=None,
            reason=f"{resolve.reason}; nothing to undo (the action did not run)",
        )


def _held(stored: StoredDecision | None) -> bool:
    """A fire held back by a guardrail that lifts: at judgement (recorded suppressed) or at
    the gate (outcome skipped, verdict suppressed)."""
    if stored is None or not stored.decision.suppressed:
        return False
    return stored.outcome is None or stored.outcome.status is OutcomeStatus.SKIPPED
