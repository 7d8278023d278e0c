"""A fake NVML with pynvml's function names, return types, units and error classes.

``gpuops.exporters.nvml.scenarios`` builds it for tests, demos (``gpuops exporter nvml
--fake-nvml``)
and the benchmark; the collector, the XID watcher and the agent call it exactly as they call
pynvml. Units are NVML's: milliwatts, millijoules, MHz, percent, bytes. Errors are pynvml's own
classes (taken from ``gpuops.exporters.nvml.nvml``). Faults are switched on with the methods at the
end.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuops.exporters.nvml import nvml

NOT_A_MIG_ID = 0xFFFFFFFF


@dataclass
class FakeProcess:
    """A process as ``nvmlDeviceGetComputeRunningProcesses`` returns it (pynvml field names)."""

    pid: int
    usedGpuMemory: int  # noqa: N815 (pynvml's field name)
    gpuInstanceId: int = NOT_A_MIG_ID  # noqa: N815
    computeInstanceId: int = NOT_A_MIG_ID  # noqa: N815


@dataclass
class FakeMig:
    """One MIG device (a GPU instance with one compute instance)."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    profile: str
    memory_total: int
    memory_used: int
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    """One GPU's state, in NVML units."""

    uuid: str
    name: str
    minor_number: int | None = None
    """/dev/nvidiaN; None: the same as the index (what most machines have)."""
    memory_total: int = 80 * 2**30
    memory_used: int = 0
    util_gpu: int = 0
    util_memory: int = 0
    temperature: int = 35
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    power_limit_range_mw: tuple[int, int] = (200_000, 700_000)
    energy_mj: int = 1_000_000
    clocks: dict[int, int] = field(default_factory=dict)
    max_clocks: dict[int, int] = field(default_factory=dict)
    min_graphics_mhz: int = 345
    clock_event_reasons: int = 0
    pstate: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    pcie_replays: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    mig_enabled: bool | None = False  # None: MIG not supported on this GPU
    mig: list[FakeMig] = field(default_factory=list)
    max_mig: int = 7
    unsupported: set[str] = field(default_factory=set)
    locked_clocks: tuple[int, int] | None = None
    lost: bool = False
    resets: int = 0
    """How often the node agent reset it."""
    lose_after_reads: int | None = None
    reads: int = 0

    def supported_graphics_clocks(self) -> list[int]:
        top = self.max_clocks.get(nvml.CLOCKS["graphics"], 1980)
        return list(range(top, self.min_graphics_mhz - 1, -15))


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: int | None = None  # position in FakeGpu.mig for a MIG device handle


@dataclass
class _EventData:
    """pynvml's ``c_nvmlEventData_t`` fields."""

    device: _Handle
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815
    gpuInstanceId: int = NOT_A_MIG_ID  # noqa: N815
    computeInstanceId: int = NOT_A_MIG_ID  # noqa: N815


class _EventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue[_EventData] = queue.Queue()
        self.handles: set[int] = set()


class FakeNvml:
    """Stands in for the pynvml module: ``FakeNvml(gpus).nvmlDeviceGetCount()``."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        driver_version: str = "550.54.15",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.library_missing = False
        self.no_permission = False
        self.missing_functions: set[str] = set()
        self.calls = 0
        self._clock = clock
        self._started = clock()
        self._initialized = 0
        self._driver_error: type[Exception] | None = None
        self._event_sets: list[_EventSet] = []
        self._lock = threading.RLock()

    # --- library ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names throughout)
        if self.library_missing:
            raise nvml.LibraryNotFound()
        with self._lock:
            self._initialized += 1
            self._driver_error = None

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._check("nvmlShutdown")
        with self._lock:
            self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise nvml.InvalidArgument()
        return _Handle(index)

    # --- identity and MIG -------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        return gpu.uuid if handle.mig is None else gpu.mig[handle.mig].uuid

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMinorNumber", whole_gpu=True)
        return handle.index if gpu.minor_number is None else gpu.minor_number

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        if handle.mig is None:
            return gpu.name
        return f"{gpu.name} MIG {gpu.mig[handle.mig].profile}"

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if gpu.mig_enabled is None:
            raise nvml.NotSupported()
        mode = nvml.DEVICE_MIG_ENABLE if gpu.mig_enabled else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        if gpu.mig_enabled is None:
            raise nvml.NotSupported()
        return gpu.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_enabled or index >= gpu.max_mig:
            raise nvml.InvalidArgument()
        if index >= len(gpu.mig):
            raise nvml.NotFound()
        return _Handle(handle.index, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            raise nvml.InvalidArgument()
        return gpu.mig[handle.mig].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        if handle.mig is None:
            raise nvml.InvalidArgument()
        return gpu.mig[handle.mig].compute_instance_id

    # --- readings ---------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates", whole_gpu=True)
        if gpu.mig_enabled:
            raise nvml.NotSupported()
        gpu.reads += 1
        if gpu.lose_after_reads is not None and gpu.reads >= gpu.lose_after_reads:
            self.fall_off_bus(handle.index)
        return nvml.Utilization(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> Any:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if handle.mig is not None:
            mig = gpu.mig[handle.mig]
            total, used = mig.memory_total, mig.memory_used
        else:
            total, used = gpu.memory_total, gpu.memory_used
        return nvml.Memory(total=total, used=used, free=total - used)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature", whole_gpu=True)
        if sensor != nvml.TEMPERATURE_GPU:
            raise nvml.InvalidArgument()
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetPowerUsage", whole_gpu=True).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption", whole_gpu=True)
        return gpu.energy_mj + int(gpu.power_mw * (self._clock() - self._started))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit", whole_gpu=True).power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementLimit", whole_gpu=True)
        return gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: _Handle) -> list[int]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementLimitConstraints", whole_gpu=True)
        return list(gpu.power_limit_range_mw)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:  # noqa: N802, A002
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo", whole_gpu=True)
        mhz = gpu.clocks[type]
        if gpu.locked_clocks and type in (nvml.CLOCKS["graphics"], nvml.CLOCKS["sm"]):
            mhz = max(gpu.locked_clocks[0], min(mhz, gpu.locked_clocks[1]))
        return mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, type: int) -> int:  # noqa: N802, A002
        return self._gpu(handle, "nvmlDeviceGetMaxClockInfo", whole_gpu=True).max_clocks[type]

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: _Handle) -> list[int]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetSupportedMemoryClocks", whole_gpu=True)
        return [gpu.max_clocks[nvml.CLOCKS["memory"]]]

    def nvmlDeviceGetSupportedGraphicsClocks(
        self, handle: _Handle, memoryClockMHz: int
    ) -> list[int]:  # noqa: N802, N803
        gpu = self._gpu(handle, "nvmlDeviceGetSupportedGraphicsClocks", whole_gpu=True)
        if memoryClockMHz != gpu.max_clocks[nvml.CLOCKS["memory"]]:
            raise nvml.InvalidArgument()
        return gpu.supported_graphics_clocks()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons", whole_gpu=True)
        return gpu.clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", whole_gpu=True)
        return gpu.clock_event_reasons

    def nvmlDeviceGetPerformanceState(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetPerformanceState", whole_gpu=True).pstate

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int, counterType: int) -> int:  # noqa: N802, N803
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors", whole_gpu=True)
        return gpu.ecc.get((errorType, counterType), 0)

    def reset_gpu(self, uuid: str) -> bool:
        """What ``nvidia-smi --gpu-reset`` does to the GPU of ``uuid`` (not an NVML function:
        ``scenarios.fake_reset`` hands it to the node agent): volatile ECC counts clear, a
        pending row remapping is applied. False: no such GPU, or a lost one (not reachable)."""
        with self._lock:
            gpu = next((g for g in self.gpus if g.uuid == uuid), None)
            if gpu is None or gpu.lost:
                return False
            volatile = nvml.ECC_COUNTERS["volatile"]
            gpu.ecc = {k: v for k, v in gpu.ecc.items() if k[1] != volatile}
            corrected, uncorrected, _, failure = gpu.remapped_rows
            gpu.remapped_rows = (corrected, uncorrected, 0, failure)
            gpu.resets += 1
            return True

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetRemappedRows", whole_gpu=True).remapped_rows

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter", whole_gpu=True).pcie_replays

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[FakeProcess]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return list(gpu.processes if handle.mig is None else gpu.mig[handle.mig].processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[FakeProcess]:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    # --- control ----------------------------------------------------------------------------
    def nvmlDeviceSetGpuLockedClocks(
        self, handle: _Handle, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:  # noqa: N802, N803, E501
        gpu = self._control(handle, "nvmlDeviceSetGpuLockedClocks")
        if minGpuClockMHz > maxGpuClockMHz:
            raise nvml.InvalidArgument()
        gpu.locked_clocks = (minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: _Handle) -> None:  # noqa: N802
        self._control(handle, "nvmlDeviceResetGpuLockedClocks").locked_clocks = None

    def nvmlDeviceSetPowerManagementLimit(self, handle: _Handle, limit: int) -> None:  # noqa: N802
        gpu = self._control(handle, "nvmlDeviceSetPowerManagementLimit")
        low, high = gpu.power_limit_range_mw
        if not low <= limit <= high:
            raise nvml.InvalidArgument()
        gpu.power_limit_mw = limit

    # --- events -----------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:  # noqa: N802
        self._check("nvmlEventSetCreate")
        event_set = _EventSet()
        with self._lock:
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(
        self, handle: _Handle, eventTypes: int, eventSet: _EventSet
    ) -> None:  # noqa: N802, N803, E501
        self._gpu(handle, "nvmlDeviceRegisterEvents", whole_gpu=True)
        if eventTypes & nvml.EVENT_XID:
            eventSet.handles.add(handle.index)

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _EventData:  # noqa: N802, N803
        self._check("nvmlEventSetWait")
        try:
            return eventSet.queue.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise nvml.Timeout() from None

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:  # noqa: N802, N803
        with self._lock:
            if eventSet in self._event_sets:
                self._event_sets.remove(eventSet)

    # --- faults -----------------------------------------------------------------------------
    def inject_xid(self, index: int, xid: int) -> None:
        """Deliver an XID critical error event for GPU ``index`` to every event set."""
        with self._lock:
            for event_set in self._event_sets:
                if index in event_set.handles:
                    event_set.queue.put(_EventData(_Handle(index), nvml.EVENT_XID, xid))

    def fall_off_bus(self, index: int) -> None:
        """GPU ``index`` is lost: XID 79, then every call on it raises ``GpuIsLost``."""
        self.inject_xid(index, 79)
        self.gpus[index].lost = True

    def break_driver(self, error: type[Exception]) -> None:
        """Every call raises ``error`` (an NVML error class) until NVML is initialised again."""
        self._driver_error = error

    def _check(self, function: str) -> None:
        self.calls += 1
        if self._driver_error is not None:
            raise self._driver_error()
        if self._initialized <= 0:
            raise nvml.Uninitialized()
        if function in self.missing_functions:
            raise nvml.FunctionNotFound()

    def _gpu(self, handle: _Handle, function: str, whole_gpu: bool = False) -> FakeGpu:
        self._check(function)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise nvml.GpuIsLost()
        if function in gpu.unsupported or (whole_gpu and handle.mig is not None):
            raise nvml.NotSupported()
        return gpu

    def _control(self, handle: _Handle, function: str) -> FakeGpu:
        gpu = self._gpu(handle, function, whole_gpu=True)
        if self.no_permission:
            raise nvml.NoPermission()
        return gpu
