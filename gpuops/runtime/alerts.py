"""The alert inbox: Alertmanager alerts (webhook v4 ``alerts[]`` items) turned into decisions.

The webhook handler (``gpuops.api.routes.alertmanager``) writes a notification's alerts to the
durable inbox of the state file, queues them here as one group and answers; this collaborator's
worker thread (owned by the engine, not by the API) takes up to ``BATCH`` of them at a time, the
smallest group's first (``_Waiting``), and decides them — a firing alert runs the ``action`` of
every policy whose ``trigger.alertmanager`` labels it carries, a resolved one their
``on_clear`` — through the cycle's commit and the gate, one commit per policy for the batch. It
then records their (fingerprint, startsAt, status) and takes them out of the inbox in one
transaction, so a retried or repeated notification acts once, also across restarts. Alerts
still in the inbox at start are handled first; decision ids keep a replay from acting twice.

Alert episodes remember their resolve: a resolve that arrives before the firing, or while the
firing's action runs, is kept (``early_resolves``) and undoes once that action has succeeded.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import count, groupby
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gpuops.model.decisions import (
    Decision,
    Outcome,
    OutcomeStatus,
    Transition,
    Verdict,
    decision_id,
)
from gpuops.model.evaluation import evaluate_alert
from gpuops.model.rules.model import Policy
from gpuops.runtime.cycle import Cycle
from gpuops.runtime.rulebook import Rulebook
from gpuops.store.errors import StateError
from gpuops.store.interface import AlertKey, DecisionStatus, Store, StoredDecision

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
        self._waiting = _Waiting()
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

    # --- deciding ------------------------------------------------------------------------
    def handle(self, alert: Mapping[str, Any]) -> list[Decision]:
        """Decide on one alert (``Engine.handle_alert``; a resolve that came early, once its
        fire succeeded). Ids come from (policy, target, startsAt), so a retried webhook never
        acts twice."""
        run = _Run(self._clock())
        one = _Alert(None, alert, None)
        self._decide(run, one)
        self._store_run(run)
        if one.error is not None:
            raise one.error
        return one.decided

    def _candidates(self, alert: Mapping[str, Any], now: float) -> list[tuple[Policy, Decision]]:
        """What ``alert`` decides for each policy it triggers, before its history is read
        (held fires, resolves with nothing to undo)."""
        labels = _labels(alert)
        firing = alert.get("status", "firing") == "firing"
        episode = _epoch(str(alert.get("startsAt", ""))) or now
        found = []
        for policy in self._rulebook.rules.policies():
            decision = evaluate_alert(policy, labels, firing, episode, now)
            if decision is not None:
                found.append((policy, decision))
        return found

    def _decide(self, run: _Run, one: _Alert) -> None:
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

    def _stored(self, run: _Run, decision_id: str) -> StoredDecision | None:
        """The stored decision ``decision_id``: one ``run`` decided is stored first; one read
        for the batch (``_prefetch``) is not read again."""
        if decision_id in run.ids:
            self._store_run(run)
        if decision_id in run.stored:
            return run.stored[decision_id]
        return self._store.decision(decision_id)

    def _after_holds(self, fire: Decision, run: _Run) -> Decision:
        """The fire to decide now: the episode's first, or — when that one was held back (kill
        switch, pause, budget: at judgement or at the gate) and Alertmanager notifies again —
        the next repeat, a new decision id that is judged and run through the gate like any."""
        while _held(self._stored(run, fire.id)):
            repeat = fire.repeat + 1
            fire = replace(
                fire,
                repeat=repeat,
                id=decision_id(
                    fire.policy, fire.target.key, fire.episode_start, fire.transition, repeat
                ),
            )
        return fire

    def _was_held(self, one: _Alert, run: _Run) -> bool:
        """Whether this firing alert's last decision was held back (decided again when
        Alertmanager notifies again, although the notification is known)."""
        if one.candidates is None:
            one.candidates = self._candidates(one.alert, run.now)
        for _, decision in one.candidates:
            after = self._after_holds(decision, run)
            if after.repeat > 0 and self._stored(run, after.id) is None:
                return True
        return False

    def _undo_only_what_ran(
        self, resolve: Decision, alert: Mapping[str, Any], run: _Run
    ) -> Decision | None:
        """A resolved alert runs on_clear only if its firing alert's action ran and succeeded;
        while that action has not run yet (or its firing has not arrived), the resolve waits
        for it (None: nothing decided now)."""
        fire_id = decision_id(resolve.policy, resolve.target.key, resolve.episode_start, "fire")
        if resolve.id in run.ids:
            self._store_run(run)
        fire = self._stored(run, fire_id)
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

    # --- storing ---------------------------------------------------------------------------
    def _store_run(self, run: _Run) -> None:
        """Judge, store and hand to the gate the decisions of ``run`` (one commit per policy),
        then record its alerts' episodes and take their items out of the inbox; ``run`` is
        empty after."""
        for policy, pairs in run.policies.values():
            self._commit(run.now, policy, pairs)
        for stored in run.ids:
            run.stored.pop(stored, None)
        alerts = run.alerts
        run.clear()
        if self._finish(alerts):
            run.known.update(a.key for a in alerts if a.key is not None and a.error is None)

    def _commit(self, now: float, policy: Policy, pairs: Sequence[tuple[_Alert, Decision]]) -> None:
        """One commit of ``policy``'s decisions; when it fails, those of each alert on their
        own (one bad alert fails alone), unless the state database failed (it would fail
        each)."""
        decisions = [d for _, d in pairs]
        try:
            population = self._cycle.population(policy, now, decisions)
            committed = self._cycle.commit(policy, decisions, None, now, population)
        except Exception as exc:
            alerts = list(dict.fromkeys(a for a, _ in pairs))
            if len(alerts) == 1 or isinstance(exc, StateError):
                for one in alerts:
                    one.error = one.error or exc
                return
            log.warning(
                "the decisions of %d alerts for %s failed together (%s): committed one alert"
                " at a time",
                len(alerts),
                policy.name,
                exc,
            )
            for one in alerts:
                self._commit(now, policy, [(a, d) for a, d in pairs if a is one])
            return
        for (one, _), judged in zip(pairs, committed.decisions, strict=True):
            one.decided.append(judged)

    def _finish(self, alerts: Sequence[_Alert]) -> bool:
        """Record the episodes of ``alerts`` handled and take their items out of the inbox (one
        transaction: a crash before it replays them, and their decision ids keep the replay
        from acting twice); count and log them. False: they could not be recorded."""
        keys = [a.key for a in alerts if a.key is not None and a.error is None]
        items = [a.item for a in alerts if a.item is not None]
        recorded = True
        if keys or items:
            try:
                self._store.alerts_handled(keys, items, self._clock())
            except StateError as exc:  # e.g. fenced: the next leader adopts them
                log.warning("%d alerts stay in the inbox: %s", len(items), exc)
                recorded = False
        tally: dict[str, int] = {}
        for one in alerts:
            if one.item is None:
                continue  # not the worker's (``handle``): its caller sees what became of it
            fingerprint = one.alert.get("fingerprint")
            if one.error is not None:
                tally["error"] = tally.get("error", 0) + 1
                log.error("alert %s could not be handled", fingerprint, exc_info=one.error)
            elif one.key is None:
                tally["duplicate"] = tally.get("duplicate", 0) + 1
                log.debug("alert %s already handled", fingerprint)
            else:
                tally["handled"] = tally.get("handled", 0) + 1
                log.info(
                    "alert %s (%s) %s: %d decisions",
                    _labels(one.alert).get("alertname", "?"),
                    fingerprint,
                    one.key.status,
                    len(one.decided),
                )
        for result, n in tally.items():
            self.alerts.labels(result).inc(n)
        return recorded

    # --- the worker ----------------------------------------------------------------------
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

    def submit(self, alerts: Sequence[Mapping[str, Any]]) -> None:
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

    def _queue(self, group: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
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

    def _handle_batch(self, batch: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        """Dedupe and decide the alerts of ``batch`` in order, then store them together. An
        alert whose decision reads what another of the batch decided (its firing, the same
        episode again) is decided after those are stored, as one after the other would be."""
        run = _Run(self._clock())
        alerts = self._prefetch(run, batch)
        for one in alerts:
            try:
                if one.key in run.keys:
                    self._store_run(run)
                if self._known(one, run):
                    one.key = None  # recorded already: a duplicate
                    run.alerts.append(one)
                    continue
                self._decide(run, one)
            except Exception as exc:  # one bad alert must not stop the others
                one.error = exc
                if one not in run.alerts:
                    run.alerts.append(one)
        self._store_run(run)

    def _prefetch(self, run: _Run, batch: Sequence[tuple[int, Mapping[str, Any]]]) -> list[_Alert]:
        """The alerts of ``batch`` with what ``run`` reads about them read at once: which were
        handled already, and the stored decisions their own would repeat or undo (a read
        apiece waited for the state store's lock behind the gate's writes)."""
        alerts = [_Alert(item, alert, _key(alert)) for item, alert in batch]
        ids: list[str] = []
        for one in alerts:
            try:
                one.candidates = self._candidates(one.alert, run.now)
            except Exception as exc:  # decided (and failing) on its own in ``_decide``
                log.debug("alert %s: %s", one.alert.get("fingerprint"), exc)
                continue
            for _, d in one.candidates:
                ids.append(d.id)
                if d.transition is not Transition.FIRE:
                    ids.append(decision_id(d.policy, d.target.key, d.episode_start, "fire"))
        run.known = self._store.known_alerts([a.key for a in alerts if a.key is not None])
        stored = self._store.stored_decisions(ids)
        run.stored = {i: stored.get(i) for i in ids}
        return alerts

    def _known(self, one: _Alert, run: _Run) -> bool:
        """Whether ``one`` was handled already (and is not a firing held back then)."""
        key = one.key
        assert key is not None
        if key not in run.known:
            return False
        return not (key.status == "firing" and self._was_held(one, run))


@dataclass(eq=False)
class _Alert:
    """An alert being handled: its inbox item (None: not the worker's), its episode (None: not
    to be recorded, a duplicate), its decisions as judged once stored, what went wrong."""

    item: int | None
    alert: Mapping[str, Any]
    key: AlertKey | None
    candidates: list[tuple[Policy, Decision]] | None = None
    decided: list[Decision] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class _Run:
    """Alerts decided and not stored yet: their decisions by policy, in order, and the decision
    ids and episodes among them (what reads one of those is decided after they are stored)."""

    now: float
    alerts: list[_Alert] = field(default_factory=list)
    policies: dict[str, tuple[Policy, list[tuple[_Alert, Decision]]]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    keys: set[AlertKey] = field(default_factory=set)
    stored: dict[str, StoredDecision | None] = field(default_factory=dict)
    """Decisions read for the whole batch (None: not stored then); kept across ``clear``."""
    known: set[AlertKey] = field(default_factory=set)
    """The batch's alerts handled before (or by a part of it stored already)."""

    def add(self, one: _Alert, decisions: Iterable[tuple[Policy, Decision]]) -> None:
        self.alerts.append(one)
        if one.key is not None:
            self.keys.add(one.key)
        for policy, decision in decisions:
            self.policies.setdefault(policy.name, (policy, []))[1].append((one, decision))
            self.ids.add(decision.id)

    def clear(self) -> None:
        self.alerts = []
        self.policies = {}
        self.ids = set()
        self.keys = set()


@dataclass(eq=False)
class _Group:
    """One notification's alerts not taken yet (inbox item -> alert), in arrival order."""

    seq: int
    alerts: OrderedDict[int, Mapping[str, Any]]


class _Waiting:
    """The queued alerts, by notification. ``take`` hands out those of the group with the
    fewest left first (of two the same size, the older): a notification of a few alerts — a
    GPU fell off the bus — waits for at most the batch being decided, not for a group of
    thousands. Smallest first, rather than a queue per receiver or per policy: one receiver
    sends large and small groups alike, the policies an alert triggers are known only once it
    is decided, and what makes a notification wait long is the size of those before it. An
    alert's own notifications stay in order: taking one takes first its older ones still
    waiting (the same fingerprint) from whatever group holds them, so an older event of an
    alert is never decided after a newer one (a firing after its resolve, or after its next
    episode)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Group]] = []  # (alerts left when pushed, seq, group)
        self._seq = count()
        self._group: dict[int, _Group] = {}  # item -> the group holding it
        self._lines: dict[str, list[int]] = {}  # fingerprint -> its items waiting, oldest first

    def __len__(self) -> int:
        return len(self._group)

    def add(self, alerts: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        group = _Group(next(self._seq), OrderedDict(alerts))
        for item, alert in group.alerts.items():
            self._group[item] = group
            bisect.insort(self._lines.setdefault(_fingerprint(alert), []), item)
        heapq.heappush(self._heap, (len(group.alerts), group.seq, group))

    def take(self, most: int) -> list[tuple[int, Mapping[str, Any]]]:
        """Up to ``most`` alerts (a few more where older notifications of theirs come along)."""
        taken: list[tuple[int, Mapping[str, Any]]] = []
        while len(taken) < most and self._heap:
            left, seq, group = self._heap[0]
            if left != len(group.alerts):  # it shrank since: its place by what it has left
                heapq.heappop(self._heap)
                if group.alerts:
                    heapq.heappush(self._heap, (len(group.alerts), seq, group))
                continue
            self._take(next(iter(group.alerts)), taken)
        return taken

    def _take(self, item: int, taken: list[tuple[int, Mapping[str, Any]]]) -> None:
        """Take ``item``, after the older items of its alert still waiting."""
        fingerprint = _fingerprint(self._group[item].alerts[item])
        line = self._lines[fingerprint]
        upto = line.index(item) + 1
        for older in line[:upto]:
            taken.append((older, self._group.pop(older).alerts.pop(older)))
        del line[:upto]
        if not line:
            del self._lines[fingerprint]


def _key(alert: Mapping[str, Any]) -> AlertKey:
    return AlertKey(
        _fingerprint(alert), str(alert.get("startsAt", "")), str(alert.get("status", "firing"))
    )


def _fingerprint(alert: Mapping[str, Any]) -> str:
    return str(alert.get("fingerprint", ""))


def _labels(alert: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(alert.get("labels", {})).items()}


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
