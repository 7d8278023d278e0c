"""NVML initialisation, re-initialisation and device enumeration, shared by the collector, the
XID watcher and the node agent of one exporter process (``gpuops.exporters.nvml.server`` builds it).

NVML is initialised lazily, on the first scrape, so that registering the collector touches no
NVML. A driver-level error (``nvml.DRIVER_LEVEL``) marks the session stale: the next call shuts
NVML down and initialises it again. A missing library is logged once, not on every scrape.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from gpuops.exporters.nvml import nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    """A GPU as enumerated at initialisation. ``handle`` is None when the GPU was already lost."""

    index: int
    uuid: str
    name: str
    handle: Any
    minor_number: int | None = None
    """The device's /dev/nvidiaN number (Slurm's GRES order follows it); None: not known."""


class NvmlSession:
    """One NVML initialisation and its devices; thread-safe."""

    def __init__(self, backend: nvml.Backend) -> None:
        self.backend = backend
        self.driver_version = ""
        self.generation = 0
        """Incremented on every successful initialisation (watchers re-register on change)."""
        self.reinitializations = 0
        self.last_error = ""
        self._devices: tuple[Device, ...] = ()
        self._initialized = False
        self._known_uuids: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def initialized(self) -> bool:
        return self._initialized

    def devices(self) -> tuple[Device, ...] | None:
        """The GPUs, initialising NVML first when needed; None while NVML is unusable."""
        with self._lock:
            if not self._initialized:
                self._initialize()
            return self._devices if self._initialized else None

    def device(self, ref: str) -> Device | None:
        """The device whose uuid or index is ``ref``."""
        for dev in self.devices() or ():
            if ref in (dev.uuid, str(dev.index)):
                return dev
        return None

    def invalidate(self, exc: BaseException) -> None:
        """A driver-level error happened: initialise again on the next call."""
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            self.reinitializations += 1
            self.last_error = nvml.error_name(exc)
            log.warning("NVML failed with %s; it will be initialised again on the next scrape", exc)
            try:
                self.backend.nvmlShutdown()
            except nvml.NVMLError as shutdown_exc:
                log.debug("nvmlShutdown after a driver error: %s", shutdown_exc)

    def close(self) -> None:
        with self._lock:
            if self._initialized:
                self._initialized = False
                try:
                    self.backend.nvmlShutdown()
                except nvml.NVMLError as exc:
                    log.debug("nvmlShutdown: %s", exc)

    def _initialize(self) -> None:
        try:
            self.backend.nvmlInit()
        except nvml.NVMLError as exc:
            self._report_unusable(exc)
            return
        try:
            self.driver_version = str(self.backend.nvmlSystemGetDriverVersion())
            self._devices = tuple(self._enumerate())
        except nvml.NVMLError as exc:  # any error here: not usable now, try again next time
            self._report_unusable(exc)
            try:
                self.backend.nvmlShutdown()
            except nvml.NVMLError:
                pass
            return
        if self.last_error:
            log.info("NVML initialised again after %s", self.last_error)
        else:
            log.info(
                "NVML initialised: driver %s, %d GPUs", self.driver_version, len(self._devices)
            )
        self.last_error = ""
        self._initialized = True
        self.generation += 1

    def _report_unusable(self, exc: BaseException) -> None:
        name = nvml.error_name(exc)
        if name != self.last_error:  # one line per new cause, not one per scrape
            if isinstance(exc, nvml.LibraryNotFound):
                log.error(
                    "NVML library libnvidia-ml.so.1 not found (is the NVIDIA driver installed?): "
                    "exporting nvml_exporter_up 0 and trying again on every scrape"
                )
            else:
                log.error(
                    "NVML cannot be initialised (%s): exporting nvml_exporter_up 0 and trying "
                    "again on every scrape",
                    exc,
                )
        self.last_error = name

    def _minor_number(self, handle: Any) -> int | None:
        try:
            return int(self.backend.nvmlDeviceGetMinorNumber(handle))
        except nvml.DRIVER_LEVEL:
            raise
        except nvml.NVMLError:  # not supported (e.g. Windows), or the GPU went away
            return None

    def _enumerate(self) -> list[Device]:
        devices = []
        for index in range(self.backend.nvmlDeviceGetCount()):
            try:
                handle = self.backend.nvmlDeviceGetHandleByIndex(index)
                uuid = str(self.backend.nvmlDeviceGetUUID(handle))
                name = str(self.backend.nvmlDeviceGetName(handle))
            except nvml.DRIVER_LEVEL:
                raise
            except nvml.NVMLError as exc:
                log.warning("GPU %d cannot be opened: %s", index, exc)
                devices.append(Device(index, self._known_uuids.get(index, ""), "", None))
                continue
            self._known_uuids[index] = uuid
            devices.append(Device(index, uuid, name, handle, self._minor_number(handle)))
        return devices
