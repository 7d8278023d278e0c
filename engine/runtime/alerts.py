"""The alert inbox: Alertmanager alerts (webhook v4 ``alerts[]`` items) turned into decisions.

The webhook handler (``engine.api.routes.alertmanager``) writes a notification's alerts to the
durable inbox of the state file, queues them and answers; this collaborator's worker thread
(owned by the engine, not by the API) hands each new one to ``handle`` — a firing alert runs the
``action`` of every policy whose ``trigger.alertmanager`` labels it carries, a resolved one their
``on_clear`` — through the cycle's commit and the gate, then records its (fingerprint, startsAt,
status) so a retried or repeated notification acts once, also across restarts. Alerts still in
the inbox at start are handled first; decision ids keep a replay from acting twice.

Alert episodes remember their resolve: a resolve that arrives before the firing, or while the
firing's action runs, is kept (``early_resolves``) and undoes once that action has succeeded.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from engine.decisions import Decision, Outcome, OutcomeStatus, Transition, Verdict, decision_id
from engine.evaluation import evaluate_alert
from engine.runtime.cycle import Cycle
from engine.runtime.rulebook import Rulebook
from engine.state import StateError
from engine.store import AlertKey, DecisionStatus, Store, StoredDecision

log = logging.getLogger(__name__)

_STOP = object()
EPISODE_MEMORY_S = 30 * 86400.0
"""How long handled alert episodes are remembered for deduplication (Alertmanager resends a
firing alert every repeat_interval, hours; 30 days covers any sane configuration)."""


class InboxFull(Exception):
    """The inbox has no room for a notification now (the message says why and how much is
    waiting); nothing of it was queued. The receiver answers 503: Alertmanager retries."""


class AlertInbox:
    def __init__(
        self,
        *,
        store: Store,
        rulebook: Rulebook,
        cycle: Cycle,
        clock: Callable[[], float],
        queue_size: int,
        registry: CollectorRegistry,
        require_leader: Callable[[], None] = lambda: None,
    ) -> None:
        """``require_leader``: raises on a standby replica (``NotLeaderError``): the receiver
        answers 503 naming the leader, and Alertmanager retries (it should list every replica)."""
        self._require_leader = require_leader
        self._store = store
        self._rulebook = rulebook
        self._cycle = cycle
        self._clock = clock
        self._size = queue_size
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._busy = 0
        self._queued: set[int] = set()  # inbox ids queued here and not handled yet
        self._more = False  # the inbox holds items that did not fit in the queue
        self.alerts = Counter(
            "gpuops_api_alerts",
            "Alertmanager alerts by what became of them (handled, duplicate, error, rejected).",
            ["result"],
            registry=registry,
        )

    # --- deciding ------------------------------------------------------------------------
    def handle(self, alert: Mapping[str, Any]) -> list[Decision]:
        """Decide on one alert. Ids come from (policy, target, startsAt), so a retried
        webhook never acts twice."""
        now = self._clock()
        labels = {str(k): str(v) for k, v in dict(alert.get("labels", {})).items()}
        firing = alert.get("status", "firing") == "firing"
        episode = _epoch(str(alert.get("startsAt", ""))) or now
        judged: list[Decision] = []
        for policy in self._rulebook.rules.policies():
            decision = evaluate_alert(policy, labels, firing, episode, now)
            if decision is not None and firing:
                decision = self._after_holds(decision)
            if decision is not None and not firing:
                decision = self._undo_only_what_ran(decision, alert)
            if decision is not None:
                population = self._cycle.population(policy, now, (decision,))
                committed = self._cycle.commit(policy, (decision,), None, now, population)
                judged += committed.decisions
        return judged

    def _after_holds(self, fire: Decision) -> Decision:
        """The fire to decide now: the episode's first, or — when that one was held back (kill
        switch, pause, budget: at judgement or at the gate) and Alertmanager notifies again —
        the next repeat, a new decision id that is judged and run through the gate like any."""
        while _held(self._store.decision(fire.id)):
            repeat = fire.repeat + 1
            fire = replace(
                fire,
                repeat=repeat,
                id=decision_id(
                    fire.policy, fire.target.key, fire.episode_start, fire.transition, repeat
                ),
            )
        return fire

    def _was_held(self, alert: Mapping[str, Any]) -> bool:
        """Whether this firing alert's last decision was held back (decided again when
        Alertmanager notifies again, although the notification is known)."""
        labels = {str(k): str(v) for k, v in dict(alert.get("labels", {})).items()}
        episode = _epoch(str(alert.get("startsAt", ""))) or self._clock()
        for policy in self._rulebook.rules.policies():
            decision = evaluate_alert(policy, labels, True, episode, self._clock())
            if decision is None:
                continue
            after = self._after_holds(decision)
            if after.repeat > 0 and self._store.decision(after.id) is None:
                return True
        return False

    def _undo_only_what_ran(self, resolve: Decision, alert: Mapping[str, Any]) -> Decision | None:
        """A resolved alert runs on_clear only if its firing alert's action ran and succeeded;
        while that action has not run yet (or its firing has not arrived), the resolve waits
        for it (None: nothing decided now)."""
        fire_id = decision_id(resolve.policy, resolve.target.key, resolve.episode_start, "fire")
        fire = self._store.decision(fire_id)
        if fire is not None and (
            (fire.outcome is not None and fire.outcome.ok)
            or fire.decision.verdict is Verdict.DRY_RUN
        ):
            return resolve
        if fire is None or fire.status is DecisionStatus.STARTED:
            self._store.save_early_resolve(fire_id, alert, self._clock())
            # the fire may have finished meanwhile: its hook found nothing to take
            fire = self._store.decision(fire_id)
            if fire is None or fire.status is DecisionStatus.STARTED:
                log.info(
                    "resolve of %s on %s before its action ran: undoes once it succeeds",
                    resolve.policy,
                    resolve.target.key,
                )
                return None
            self._store.take_early_resolve(fire_id)
            return self._undo_only_what_ran(resolve, alert)
        return replace(
            resolve,
            action=None,
            reason=f"{resolve.reason}; nothing to undo (the action did not run)",
        )

    def fire_finished(self, decision: Decision, outcome: Outcome) -> None:
        """The gate's outcome hook: a resolve that waited for this fire is decided now."""
        if decision.transition is not Transition.FIRE:
            return
        alert = self._store.take_early_resolve(decision.id)
        if alert is not None:
            log.info(
                "handling the resolve of %s on %s that came early",
                decision.policy,
                decision.target.key,
            )
            self.handle(alert)

    # --- the worker ----------------------------------------------------------------------
    def start(self) -> None:
        self._store.prune_alert_episodes(self._clock() - EPISODE_MEMORY_S)
        self.adopt()
        self._thread = threading.Thread(target=self._loop, name="gpuops-alerts", daemon=True)
        self._thread.start()

    def adopt(self) -> None:
        """Queue what the inbox holds and this replica has not queued: alerts received before a
        stop, or (shared inbox, docs/ha.md) by a replica that lost its lease before handling
        them. Called at start and at every election; never blocks: what does not fit now is
        adopted by the worker once it has room. The inbox is read and ``_queued`` checked under
        one lock, and the worker forgets an item only after deleting it from the inbox, so an
        item is never queued twice."""
        with self._idle:
            for item in self._store.inbox():
                if item.id in self._queued:
                    continue
                if self._busy >= self._size:
                    self._more = True
                    return
                self._queued.add(item.id)
                self._busy += 1
                self._queue.put_nowait((item.id, item.alert))
            self._more = False

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def submit(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Queue a notification's alerts, or raise ``InboxFull`` (nothing queued) when there is
        no room for them now: at most ``queue_size`` alerts wait, and a notification larger
        than that is taken whole once nothing waits (its size is bounded by the receiver's
        body limit), so that every notification the receiver accepts is taken in time."""
        self._require_leader()
        with self._idle:
            waiting = self._busy
            if waiting and waiting + len(alerts) > self._size:
                self.alerts.labels("rejected").inc(len(alerts))
                raise InboxFull(_no_room(len(alerts), waiting, self._size))
            items = self._store.inbox_add(alerts, self._clock())
            for item, alert in zip(items, alerts, strict=True):
                self._queued.add(item)
                self._busy += 1
                self._queue.put_nowait((item, alert))

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued alert is handled (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is _STOP:
                return
            assert isinstance(entry, tuple)
            item, alert = entry
            try:
                self._handle(alert)
            except Exception:  # one bad alert must not stop the receiver
                self.alerts.labels("error").inc()
                log.exception("alert %s could not be handled", alert.get("fingerprint"))
            finally:
                try:
                    self._store.inbox_done(item)
                except StateError as exc:  # e.g. fenced: the next leader adopts the item
                    log.warning("alert inbox item %d stays in the inbox: %s", item, exc)
                with self._idle:
                    self._queued.discard(item)
                    self._busy -= 1
                    self._idle.notify_all()
                    more = self._more
                if more:
                    self.adopt()

    def _handle(self, alert: Mapping[str, Any]) -> None:
        key = AlertKey(
            str(alert.get("fingerprint", "")),
            str(alert.get("startsAt", "")),
            str(alert.get("status", "firing")),
        )
        if self._store.alert_known(key) and not (key.status == "firing" and self._was_held(alert)):
            self.alerts.labels("duplicate").inc()
            log.debug("alert %s already handled", key)
            return
        decisions = self.handle(alert)
        # recorded only once handled: a crash in between replays it, and its decision ids
        # (policy, target, startsAt) keep the replay from acting twice
        self._store.seen_alert(key, self._clock())
        self.alerts.labels("handled").inc()
        log.info(
            "alert %s (%s) %s: %d decisions",
            alert.get("labels", {}).get("alertname", "?"),
            key.fingerprint,
            key.status,
            len(decisions),
        )


def _no_room(alerts: int, waiting: int, size: int) -> str:
    when = "once none waits" if alerts > size else "once enough of them are handled"
    return (
        f"the alert queue holds {waiting} alerts (api.alert_queue_size {size}): no room for"
        f" this notification of {alerts} now, taken {when}; Alertmanager will retry"
    )


def _held(stored: StoredDecision | None) -> bool:
    """A fire held back by a guardrail that lifts: at judgement (recorded suppressed) or at
    the gate (outcome skipped, verdict suppressed)."""
    if stored is None or not stored.decision.suppressed:
        return False
    return stored.outcome is None or stored.outcome.status is OutcomeStatus.SKIPPED


def _epoch(rfc3339: str) -> float | None:
    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
