"""The XID event thread: waits on ``nvmlEventSetWait`` and counts XID critical errors per GPU and
XID code, for ``nvml_gpu_xid_errors_total{xid}`` (read by ``gpuops.exporters.nvml.collector``).

Counting every event, not exporting the last XID seen, is what lets a rule say "more than one
XID 48 in an hour". The thread re-registers after NVML is initialised again; counts survive.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuops.exporters.nvml import nvml
from gpuops.exporters.nvml.session import Device, NvmlSession

log = logging.getLogger(__name__)


class XidWatcher:
    """Counts XID events of one session's GPUs on a daemon thread."""

    def __init__(
        self,
        session: NvmlSession,
        poll_ms: int = 500,
        on_xid: Callable[[str, int], None] | None = None,
    ) -> None:
        self.session = session
        self.on_xid = on_xid
        """Told (GPU UUID, XID code) of every event as it comes: the health push."""
        self.poll_ms = poll_ms
        """How long one ``nvmlEventSetWait`` blocks; bounds how long ``stop`` takes."""
        self._counts: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watching = 0
        """How many GPUs are registered for XID events now."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def counts(self) -> dict[tuple[str, str, str], int]:
        """(gpu index, uuid, xid) -> events seen since the exporter started."""
        with self._lock:
            return dict(self._counts)

    def _run(self) -> None:
        while not self._stop.is_set():
            devices = self.session.devices()
            if devices is None:
                self._stop.wait(self.poll_ms / 1000)
                continue
            try:
                self._watch(devices, self.session.generation)
            except nvml.DRIVER_LEVEL as exc:
                self.session.invalidate(exc)
            except nvml.NVMLError as exc:
                log.warning("XID event wait failed: %s; registering again", exc)
                self._stop.wait(self.poll_ms / 1000)

    def _watch(self, devices: tuple[Device, ...], generation: int) -> None:
        backend = self.session.backend
        event_set = backend.nvmlEventSetCreate()
        try:
            by_handle = self._register(devices, event_set)
            self.watching = len(by_handle)
            while not self._stop.is_set() and self.session.generation == generation:
                if not by_handle or not self.session.initialized:
                    self._stop.wait(self.poll_ms / 1000)
                    if not self.session.initialized:
                        return
                    continue
                try:
                    data = backend.nvmlEventSetWait(event_set, self.poll_ms)
                except nvml.Timeout:
                    continue
                if data.eventType & nvml.EVENT_XID:
                    self._record(by_handle.get(nvml.handle_key(data.device)), int(data.eventData))
        finally:
            self.watching = 0
            try:
                backend.nvmlEventSetFree(event_set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)

    def _register(self, devices: tuple[Device, ...], event_set: Any) -> dict[Any, Device]:
        by_handle: dict[Any, Device] = {}
        for dev in devices:
            if dev.handle is None:
                continue
            try:
                self.session.backend.nvmlDeviceRegisterEvents(dev.handle, nvml.EVENT_XID, event_set)
            except nvml.DRIVER_LEVEL:
                raise
            except nvml.NVMLError as exc:
                log.info("GPU %d (%s) does not report XID events: %s", dev.index, dev.uuid, exc)
                continue
            by_handle[nvml.handle_key(dev.handle)] = dev
        return by_handle

    def _record(self, dev: Device | None, xid: int) -> None:
        if dev is None:
            log.warning("XID %d from an unknown GPU", xid)
            return
        log.warning("XID %d on GPU %d (%s)", xid, dev.index, dev.uuid)
        key = (str(dev.index), dev.uuid, str(xid))
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
        if self.on_xid is not None:
            self.on_xid(dev.uuid, xid)
