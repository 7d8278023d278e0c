"""``AlertInbox``: the queue between the Alertmanager receiver and the decisions, and its worker.

The receiver (``gpuops.api.routes.alertmanager``) hands a notification's alerts to ``submit``,
which writes them to the durable inbox of the state store, queues them as one group
(``gpuops.runtime.alerts.waiting``) and returns, so the receiver answers at once. The worker
thread (owned by the engine, not by the API) takes up to ``BATCH`` alerts at a time and decides
them (``gpuops.runtime.alerts.deciding``). Alerts still in the inbox at start, or received by a
replica that lost its lease, are queued again (``adopt``). The gate tells it of every outcome
(``fire_finished``): a resolve that waited for its firing's action is decided then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import groupby

from prometheus_client import CollectorRegistry, Counter

from gpuops.model.alerts import Alert
from gpuops.model.decisions import Decision, Outcome, Transition
from gpuops.runtime.alerts.batch import BatchWriter
from gpuops.runtime.alerts.deciding import Decider
from gpuops.runtime.alerts.waiting import Queued, Waiting
from gpuops.runtime.cycle import Cycle
from gpuops.runtime.rulebook import Rulebook
from gpuops.store.interface import Store

log = logging.getLogger(__name__)

EPISODE_MEMORY_S = 30 * 86400.0
"""How long handled alert episodes are remembered for deduplication (Alertmanager resends a
firing alert every repeat_interval, hours; 30 days covers any sane configuration)."""

BATCH = 500
"""Alerts the worker takes and decides together: one commit per policy (the guardrail windows
read, judged and written once, one transaction, one intent write to the audit spool), one
transaction recording their episodes. What a commit costs beyond its decisions grows with the
targets the guardrails remember (the last action on each, 30 days): paid once a batch, not once
an alert. A small notification waits for at most the batch being decided (a tenth of a second
at the rate of tests/benchmarks/bench_alerts.py)."""


class InboxFull(Exception):
    """The inbox has no room for a notification now (the message says why and how much is
    waiting); nothing of it was queued. The receiver answers 503: Alertmanager retries."""


class AlertInbox:
    """The durable queue of received alerts and the worker that decides them."""

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
        self._clock = clock
        self._size = queue_size
        self._waiting = Waiting()
        self._queued: set[int] = set()  # inbox ids queued here and not handled yet
        self._idle = threading.Condition()  # guards the two above and ``_stopping``
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.alerts = Counter(
            "gpuops_api_alerts",
            "Alertmanager alerts by what became of them (handled, duplicate, error, rejected).",
            ["result"],
            registry=registry,
        )
        writer = BatchWriter(store=store, cycle=cycle, clock=clock, results=self.alerts)
        self._decider = Decider(store=store, rulebook=rulebook, writer=writer, clock=clock)

    # --- deciding --------------------------------------------------------------------------
    def handle(self, alert: Alert) -> list[Decision]:
        """Decide on one alert (``Engine.handle_alert``; a resolve that came early, once its
        fire succeeded)."""
        return self._decider.handle(alert)

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

    # --- the worker ------------------------------------------------------------------------
    def start(self) -> None:
        self._store.prune_alert_episodes(self._clock() - EPISODE_MEMORY_S)
        with self._idle:
            self._stopping = False
        self.adopt()
        self._thread = threading.Thread(target=self._loop, name="gpuops-alerts", daemon=True)
        self._thread.start()

    def adopt(self) -> None:
        """Queue what the inbox holds and this replica has not queued: alerts received before a
        stop, or (shared inbox, docs/ha.md) by a replica that lost its lease before handling
        them; the alerts of one notification (received together) as one group. Called at start
        and at every election; never blocks on the worker. The inbox is read and ``_queued``
        checked under one lock, and the worker forgets an item only after deleting it from the
        inbox, so an item is never queued twice."""
        with self._idle:
            fresh = [item for item in self._store.inbox() if item.id not in self._queued]
            for _, items in groupby(fresh, key=lambda item: item.received_at):
                self._queue([(item.id, item.alert) for item in items])

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker after the batch it decides; what is queued stays in the inbox (and
        is handled at the next start)."""
        if self._thread is None:
            return
        with self._idle:
            self._stopping = True
            self._idle.notify_all()
        self._thread.join(timeout)
        self._thread = None

    def submit(self, alerts: Sequence[Alert]) -> None:
        """Queue a notification's alerts as one group, or raise ``InboxFull`` (nothing queued)
        when there is no room for them now: at most ``queue_size`` alerts wait, and a
        notification larger than that is taken whole once none waits (its size is bounded by
        the receiver's body limit), so that every notification the receiver accepts is taken
        in time."""
        self._require_leader()
        with self._idle:
            waiting = len(self._queued)
            if waiting and waiting + len(alerts) > self._size:
                self.alerts.labels("rejected").inc(len(alerts))
                raise InboxFull(_no_room(len(alerts), waiting, self._size))
            items = self._store.inbox_add(alerts, self._clock())
            self._queue(list(zip(items, alerts, strict=True)))

    def _queue(self, group: Sequence[Queued]) -> None:
        """Queue one group (call with ``_idle`` held)."""
        if group:
            self._queued.update(item for item, _ in group)
            self._waiting.add(group)
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued alert is handled (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._queued:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            with self._idle:
                while not self._stopping and not self._waiting:
                    self._idle.wait()
                if self._stopping:
                    return
                batch = self._waiting.take(BATCH)
            try:
                self._handle_batch(batch)
            except Exception:  # a bug here must not stop the receiver
                self.alerts.labels("error").inc(len(batch))
                log.exception("a batch of %d alerts could not be handled", len(batch))
            finally:
                with self._idle:
                    self._queued.difference_update(item for item, _ in batch)
                    self._idle.notify_all()

    def _handle_batch(self, batch: Sequence[Queued]) -> None:
        """Decide and store the alerts the worker took (``Decider.handle_batch``)."""
        self._decider.handle_batch(batch)


def _no_room(alerts: int, waiting: int, size: int) -> str:
    when = "once none waits" if alerts > size else "once enough of them are handled"
    return (
        f"the alert queue holds {waiting} alerts (api.alert_queue_size {size}): no room for"
        f" this notification of {alerts} now, taken {when}; Alertmanager will retry"
    )
