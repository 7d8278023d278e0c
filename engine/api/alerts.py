"""The Alertmanager receiver's worker: the webhook handler writes the alerts to the durable
inbox of the state file, queues them and answers; this thread hands each new one to
``Engine.handle_alert`` (firing: the matching policies' action; resolved: their on_clear),
then records its (fingerprint, startsAt, status) — so a retried or repeated notification acts
once, also across restarts — and removes it from the inbox. Alerts still in the inbox at start
(the engine stopped before handling them) are handled first; decision ids keep a replay from
acting twice.

Started and stopped by the API's lifespan (``engine.api.app``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from engine.runtime import Engine

log = logging.getLogger(__name__)

_STOP = object()
EPISODE_MEMORY_S = 30 * 86400.0
"""How long handled alert episodes are remembered for deduplication (Alertmanager resends a
firing alert every repeat_interval, hours; 30 days covers any sane configuration)."""


class AlertWorker:
    def __init__(self, engine: Engine, queue_size: int, registry: CollectorRegistry) -> None:
        self.engine = engine
        self._queue: queue.Queue[object] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._busy = 0
        self.alerts = Counter(
            "gpuops_api_alerts",
            "Alertmanager alerts by what became of them (handled, duplicate, error, rejected).",
            ["result"],
            registry=registry,
        )

    def start(self) -> None:
        store = self.engine.store
        store.prune_alert_episodes(self.engine.clock() - EPISODE_MEMORY_S)
        with self._idle:
            for item, alert in store.inbox():  # received before a stop, not handled yet
                self._busy += 1
                self._queue.put((item, alert))
        self._thread = threading.Thread(target=self._loop, name="gpuops-alerts", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def submit(self, alerts: Sequence[Mapping[str, Any]]) -> bool:
        """Queue a notification's alerts; False (nothing queued) when there is no room."""
        with self._idle:
            if self._queue.maxsize - self._queue.qsize() < len(alerts):
                self.alerts.labels("rejected").inc(len(alerts))
                return False
            items = self.engine.store.inbox_add(alerts, self.engine.clock())
            for item, alert in zip(items, alerts, strict=True):
                self._busy += 1
                self._queue.put_nowait((item, alert))
        return True

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
                self.engine.store.inbox_done(item)
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def _handle(self, alert: Mapping[str, Any]) -> None:
        fingerprint = str(alert.get("fingerprint", ""))
        starts_at = str(alert.get("startsAt", ""))
        status = str(alert.get("status", "firing"))
        if self.engine.store.alert_known(fingerprint, starts_at, status):
            self.alerts.labels("duplicate").inc()
            log.debug("alert %s %s since %s already handled", fingerprint, status, starts_at)
            return
        decisions = self.engine.handle_alert(alert)
        # recorded only once handled: a crash in between replays it, and its decision ids
        # (policy, target, startsAt) keep the replay from acting twice
        self.engine.store.seen_alert(fingerprint, starts_at, status, self.engine.clock())
        self.alerts.labels("handled").inc()
        log.info(
            "alert %s (%s) %s: %d decisions",
            alert.get("labels", {}).get("alertname", "?"),
            fingerprint,
            status,
            len(decisions),
        )
