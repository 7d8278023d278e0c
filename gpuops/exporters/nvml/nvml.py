"""The only module that imports pynvml (import-linter keeps it that way).

It hands the rest of ``gpuops.exporters.nvml`` the NVML backend (the pynvml module itself, or a fake
with the same attribute names), pynvml's own error classes, the constants the collector needs and
pynvml's result structures, so that ``gpuops.exporters.nvml.fake`` raises and returns exactly what
pynvml does without importing it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

Backend = Any
"""An object with pynvml's function names: the pynvml module or
``gpuops.exporters.nvml.fake.FakeNvml``."""


def real_backend() -> Backend:
    """pynvml itself. Importing it loads nothing; ``nvmlInit`` loads libnvidia-ml.so.1."""
    return pynvml


# pynvml's error classes, re-exported under short names (the fake raises these very classes).
NVMLError: type[Exception] = pynvml.NVMLError
NotSupported: type[Exception] = pynvml.NVMLError_NotSupported
FunctionNotFound: type[Exception] = pynvml.NVMLError_FunctionNotFound
GpuIsLost: type[Exception] = pynvml.NVMLError_GpuIsLost
NoPermission: type[Exception] = pynvml.NVMLError_NoPermission
Uninitialized: type[Exception] = pynvml.NVMLError_Uninitialized
DriverNotLoaded: type[Exception] = pynvml.NVMLError_DriverNotLoaded
LibRmVersionMismatch: type[Exception] = pynvml.NVMLError_LibRmVersionMismatch
LibraryNotFound: type[Exception] = pynvml.NVMLError_LibraryNotFound
InvalidArgument: type[Exception] = pynvml.NVMLError_InvalidArgument
Timeout: type[Exception] = pynvml.NVMLError_Timeout
NotFound: type[Exception] = pynvml.NVMLError_NotFound
Unknown: type[Exception] = pynvml.NVMLError_Unknown

UNSUPPORTED: tuple[type[Exception], ...] = (NotSupported, FunctionNotFound)
"""The metric does not exist on this GPU or driver: omit the series."""

DRIVER_LEVEL: tuple[type[Exception], ...] = (
    Uninitialized,
    DriverNotLoaded,
    LibRmVersionMismatch,
    LibraryNotFound,
)
"""NVML as a whole is unusable: shut down and initialise again on the next scrape."""


def error_name(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` -> ``GpuIsLost``; other exceptions by their class name."""
    name = type(exc).__name__
    return name.removeprefix("NVMLError_")


# Result structures pynvml returns (ctypes structures with the same fields).
Utilization: type[Any] = pynvml.c_nvmlUtilization_t
"""``.gpu`` and ``.memory``: percent of the last sample period."""
Memory: type[Any] = pynvml.c_nvmlMemory_t
"""``.total``, ``.free``, ``.used``: bytes."""

TEMPERATURE_GPU: int = pynvml.NVML_TEMPERATURE_GPU
DEVICE_MIG_ENABLE: int = pynvml.NVML_DEVICE_MIG_ENABLE
EVENT_XID: int = pynvml.nvmlEventTypeXidCriticalError

CLOCKS: dict[str, int] = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}
"""The ``clock`` label value -> NVML clock type."""

ECC_ERRORS: dict[str, int] = {
    "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
ECC_COUNTERS: dict[str, int] = {
    "volatile": pynvml.NVML_VOLATILE_ECC,
    "aggregate": pynvml.NVML_AGGREGATE_ECC,
}

CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
"""The ``reason`` label value -> bit of ``nvmlDeviceGetCurrentClocksEventReasons``."""


def handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle: pynvml returns a new ctypes pointer object for the
    same device (e.g. in event data), so compare the address it points to."""
    if isinstance(handle, pynvml.c_nvmlDevice_t):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle
