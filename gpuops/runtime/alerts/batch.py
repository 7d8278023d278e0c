"""Alerts decided together, and how what they decided is stored: one commit per policy through
the cycle (judged, stored and handed to the gate), then the alerts' episodes recorded and their
inbox items taken out in one transaction, so a retried or repeated notification acts once, also
across restarts.

``Batch`` holds what ``gpuops.runtime.alerts.deciding.Decider`` decided and not stored yet;
``BatchWriter.store`` stores it (and is called early when an alert reads what another of the
batch decided). Counts what became of the inbox's alerts (``gpuops_api_alerts_total``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter

from gpuops.model.alerts import Alert
from gpuops.model.decisions import Decision
from gpuops.model.rules.model import Policy
from gpuops.runtime.cycle import Cycle
from gpuops.store.errors import StateError
from gpuops.store.interface import AlertKey, Store, StoredDecision

log = logging.getLogger(__name__)


def episode_key(alert: Alert) -> AlertKey:
    """What makes a notification of ``alert`` the same one again (a retried webhook, a
    resend): its fingerprint, ``startsAt`` and status, as recorded once handled."""
    return AlertKey(alert.fingerprint, alert.starts_at, alert.status.value)


@dataclass(eq=False)
class Pending:
    """An alert being handled: its inbox item (None: not the worker's), its episode (None: not
    to be recorded, a duplicate), what it decides for each policy it triggers before its
    history is read (``candidates``), its decisions as judged once stored, what went wrong."""

    item: int | None
    alert: Alert
    key: AlertKey | None
    candidates: list[tuple[Policy, Decision]] | None = None
    decided: list[Decision] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class Batch:
    """Alerts decided and not stored yet: their decisions by policy, in order, and the decision
    ids and episodes among them (what reads one of those is decided after they are stored)."""

    now: float
    alerts: list[Pending] = field(default_factory=list)
    policies: dict[str, tuple[Policy, list[tuple[Pending, Decision]]]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    keys: set[AlertKey] = field(default_factory=set)
    stored: dict[str, StoredDecision | None] = field(default_factory=dict)
    """Decisions read for the whole batch (None: not stored then); kept across ``clear``."""
    known: set[AlertKey] = field(default_factory=set)
    """The batch's alerts handled before (or by a part of it stored already)."""

    def add(self, one: Pending, decisions: Iterable[tuple[Policy, Decision]]) -> None:
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


class BatchWriter:
    """Stores what a batch decided."""

    def __init__(
        self, *, store: Store, cycle: Cycle, clock: Callable[[], float], results: Counter
    ) -> None:
        """``results``: the counter of what became of the inbox's alerts, by result."""
        self._store = store
        self._cycle = cycle
        self._clock = clock
        self._results = results

    def stored(self, run: Batch, decision_id: str) -> StoredDecision | None:
        """The stored decision ``decision_id``: one ``run`` decided is stored first; one read
        for the batch (``Decider.prefetch``) is not read again."""
        if decision_id in run.ids:
            self.store(run)
        if decision_id in run.stored:
            return run.stored[decision_id]
        return self._store.decision(decision_id)

    def store(self, run: Batch) -> None:
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

    def _commit(
        self, now: float, policy: Policy, pairs: Sequence[tuple[Pending, Decision]]
    ) -> None:
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

    def _finish(self, alerts: Sequence[Pending]) -> bool:
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
                continue  # not the worker's (``Decider.handle``): its caller sees what became of it
            fingerprint = one.alert.fingerprint
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
                    one.alert.name,
                    fingerprint,
                    one.key.status,
                    len(one.decided),
                )
        for result, n in tally.items():
            self._results.labels(result).inc(n)
        return recorded
