"""The node agent's health events, pushed to the engine the moment NVML reports them.

``HealthPusher`` takes an XID (from ``gpuops.exporters.nvml.events.XidWatcher``) or a lost
GPU (from ``gpuops.exporters.nvml.collector``) and sends it on its own thread to the engine's
``POST /api/v1/health/events`` (docs/health.md) with a bearer token. Events wait in a bounded
queue while the engine is away and are sent again, in order, until the engine answers 200:
each has an id (a random id of this process and a sequence number), so a second sending is a
duplicate the engine ignores. A 400 (a body the engine cannot read: a bug, not a delay) drops
that batch, logged; a 413 halves the batch. With a queue directory each event is also written
to disk (``gpuops.exporters.nvml.outbox``) before it is sent and removed once the engine
answered, and a new pusher sends what an old one left; without one the queue is in memory and
ends with the process. With a boot id reader (``--agent-boot-id-file``) each event carries the
boot it was seen in and each request the node's boot now: the engine skips what a queue kept
from before a reboot. Built by ``gpuops.exporters.nvml.server``; speaks HTTP only, nothing of
the engine.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import requests
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuops.exporters.nvml.outbox import Outbox, OutboxError

log = logging.getLogger(__name__)

PATH = "/api/v1/health/events"
QUEUE_DIR = "health-events"
"""The queue's folder under the node agent's state directory (``--agent-state-dir``)."""

Entry = tuple[dict[str, Any], str | None]
"""A queued event and the name of its file in the outbox (None: in memory only)."""


class HealthPusher:
    """Sends one node's health events to the engine, retrying while it is away."""

    def __init__(
        self,
        url: str,
        token: str,
        node: str,
        *,
        pool: str = "",
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        batch: int = 500,
        queue_size: int = 100_000,
        timeout_s: float = 5.0,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 30.0,
        queue_dir: Path | None = None,
        boot_id: Callable[[], str] | None = None,
    ) -> None:
        if not token:
            raise ValueError("pushing health events needs a non-empty bearer token")
        if not node:
            raise ValueError("pushing health events needs the node's name")
        self.url = url.rstrip("/") + PATH
        self.node = node
        self.pool = pool
        """Sent with each event: the engine applies the pool's profile (observe, quarantine)."""
        self.labels = dict(labels or {})
        """Sent with each event: the node's failure domains (rack, zone) its repair is paced
        in."""
        self._boot_id = boot_id
        """The id of the node's running boot (raises when it cannot be read, e.g.
        ``gpuops.exporters.nvml.reboot.boot_id_of``'s ``AgentError``); None: not sent."""
        self._boot_unread = False
        self._headers = {"Authorization": f"Bearer {token}"}
        self._clock = clock
        self._batch = batch
        self._timeout = timeout_s
        self._min_backoff, self._max_backoff = min_backoff_s, max_backoff_s
        self._queue: deque[Entry] = deque()
        self._queue_size = queue_size
        self._boot = secrets.token_hex(4)
        self._seq = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session = requests.Session()
        self.sent = 0
        """Events the engine took (200)."""
        self.dropped = 0
        """Events dropped: the queue overflowed, the engine refused them as unreadable, or a
        file a former agent left could not be read."""
        self.failures = 0
        """Sendings that will be tried again (the engine away, 401, 5xx)."""
        self.outbox = self._open(queue_dir) if queue_dir is not None else None
        """Where the queue is kept on disk; None: in memory only."""
        self.unwritable = False
        """The last event could not be written to the outbox (kept in memory only)."""
        self._writing = threading.Lock()
        """Held while an event is numbered and written, so that events queue in order."""

    def _open(self, directory: Path) -> Outbox | None:
        """The outbox in ``directory`` with what a former agent left queued; None (logged)
        where the directory cannot be used."""
        outbox = Outbox(directory)
        try:
            left, unreadable = outbox.load()
        except OutboxError as exc:
            log.error("%s: health events are queued in memory only, lost if the agent stops", exc)
            return None
        self.dropped += unreadable
        for name, event in left:
            self._append((event, name), outbox)
        if left:
            log.warning(
                "%d health events a former agent left unsent in %s: sending them first",
                len(self._queue),
                directory,
            )
        return outbox

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="health-push", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._session.close()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def collect(self) -> Iterable[Metric]:
        """The pusher's figures on the exporter's ``/metrics`` (a prometheus_client collector)."""
        queued = GaugeMetricFamily(
            "nvml_agent_health_events_queued",
            "Health events waiting for the engine to take them.",
            value=self.pending(),
        )
        on_disk = GaugeMetricFamily(
            "nvml_agent_health_queue_on_disk",
            "1 when the queue is kept on disk (it outlives the agent), 0 when in memory only "
            "(no usable directory, or the last event could not be written).",
            value=int(self.outbox is not None and not self.unwritable),
        )
        events = CounterMetricFamily(
            "nvml_agent_health_events",
            "Health events the engine took (sent) or that were dropped (dropped).",
            labels=["outcome"],
        )
        events.add_metric(["sent"], self.sent)
        events.add_metric(["dropped"], self.dropped)
        failures = CounterMetricFamily(
            "nvml_agent_health_push_failures",
            "Sendings to the engine that will be tried again (the engine away, 401, 5xx).",
            value=self.failures,
        )
        return [queued, on_disk, events, failures]

    def xid(self, uuid: str, code: int) -> None:
        """NVML reported XID ``code`` for the GPU ``uuid`` now."""
        self._put({"gpu": uuid, "kind": "xid", "xid": code})

    def lost(self, uuid: str) -> None:
        """The GPU ``uuid`` stopped answering NVML now."""
        self._put({"gpu": uuid, "kind": "gpu_lost"})

    def _boot_now(self) -> str | None:
        """The node's boot now; None where there is no reader or it cannot be read (logged
        once until it can again: the events go without it, acting as an older agent's)."""
        if self._boot_id is None:
            return None
        try:
            found = self._boot_id()
        except Exception as exc:  # whatever it is, the events still go
            if not self._boot_unread:
                log.warning("health events are sent without the boot they were seen in: %s", exc)
            self._boot_unread = True
            return None
        self._boot_unread = False
        return found

    def _put(self, event: dict[str, Any]) -> None:
        boot = self._boot_now()
        if boot is not None:
            event["boot_id"] = boot
        with self._writing:  # in order; the sender and /metrics do not wait for the disk
            self._seq += 1
            event.update(id=f"{self.node}-{self._boot}-{self._seq}", node=self.node)
            if self.pool:
                event["pool"] = self.pool
            if self.labels:
                event["labels"] = dict(self.labels)
            event["at"] = self._clock()
            name = self._keep(event) if self.outbox is not None else None
            with self._cond:
                self._append((event, name), self.outbox)
                self._cond.notify_all()

    def _keep(self, event: dict[str, Any]) -> str | None:
        """``event`` written to the outbox: its file's name; None (kept in memory only) where
        it cannot be, said once until an event is written again."""
        assert self.outbox is not None
        try:
            name = self.outbox.add(event)
        except OutboxError as exc:
            if not self.unwritable:
                log.error("%s: kept in memory only, and the next ones until one is written", exc)
            self.unwritable = True
            return None
        if self.unwritable:
            log.warning("health events are written to %s again", self.outbox.directory)
            self.unwritable = False
        return name

    def _append(self, entry: Entry, outbox: Outbox | None) -> None:
        """Queues ``entry``, dropping the oldest one where the queue is full."""
        if len(self._queue) >= self._queue_size:
            (oldest, name) = self._queue.popleft()
            self.dropped += 1
            log.warning(
                "health event queue full (%d): the oldest event %s is dropped",
                self._queue_size,
                oldest.get("id"),
            )
            if outbox is not None and name is not None:
                outbox.remove([name])
        self._queue.append(entry)

    def _run(self) -> None:
        backoff = self._min_backoff
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait(1.0)
                batch = [self._queue[i] for i in range(min(self._batch, len(self._queue)))]
            if not batch:
                continue
            result = self._send([event for event, _ in batch])
            if result == "retry":
                self.failures += 1
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            backoff = self._min_backoff
            if result in ("sent", "refused"):
                with self._cond:
                    done = []
                    for entry in batch:  # the queue's head, unless it overflowed meanwhile
                        if self._queue and self._queue[0] is entry:
                            self._queue.popleft()
                            done.append(entry[1])
                    if self.outbox is not None:
                        self.outbox.remove(name for name in done if name is not None)

    def _send(self, batch: list[dict[str, Any]]) -> str:
        """``sent``, ``refused`` (dropped), ``smaller`` (413: the batch halved) or ``retry``."""
        body: dict[str, Any] = {"events": batch}
        boot = self._boot_now()
        if boot is not None:
            body["boot_id"] = boot
        try:
            answer = self._session.post(
                self.url, json=body, headers=self._headers, timeout=self._timeout
            )
        except requests.RequestException as exc:
            log.warning("%d health events not sent (%s): sending again", len(batch), exc)
            return "retry"
        if answer.status_code == 200:
            self.sent += len(batch)
            log.info("sent %d health events: %s", len(batch), answer.text[:256])
            return "sent"
        if answer.status_code == 413 and self._batch > 1:
            self._batch = max(1, self._batch // 2)
            log.warning("health events: 413 from the engine: batches of %d now", self._batch)
            return "smaller"
        if answer.status_code == 400:
            self.dropped += len(batch)
            log.error(
                "the engine refused %d health events as unreadable: %s",
                len(batch),
                answer.text[:256],
            )
            return "refused"
        log.warning(
            "health events: the engine answered %d (%s): sending again",
            answer.status_code,
            answer.text[:256],
        )
        return "retry"
