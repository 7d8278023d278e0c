"""Named fake-NVML scenarios, for tests, demos and docs (``gpuops exporter nvml --fake-nvml``).

Each builder returns a fresh ``FakeNvml``; nothing is shared between calls. The benchmark uses
``healthy_h100(count)`` for its 8- and 64-GPU figures.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuops.exporters.nvml import nvml
from gpuops.exporters.nvml.agent import AgentError, GpuReset
from gpuops.exporters.nvml.fake import FakeGpu, FakeMig, FakeNvml, FakeProcess

GIB = 2**30
_G, _SM, _MEM, _VID = (nvml.CLOCKS[k] for k in ("graphics", "sm", "memory", "video"))
_ECC_CORR_VOL = (nvml.ECC_ERRORS["corrected"], nvml.ECC_COUNTERS["volatile"])
_ECC_CORR_AGG = (nvml.ECC_ERRORS["corrected"], nvml.ECC_COUNTERS["aggregate"])


def _uuid(model: int, index: int) -> str:
    return f"GPU-{model:08x}-{index:04x}-4a1b-9c2d-{index:012x}"


def h100(index: int) -> FakeGpu:
    """An H100 SXM5 80GB, busy on even indexes and idle on odd ones."""
    busy = index % 2 == 0
    return FakeGpu(
        uuid=_uuid(0x5100, index),
        name="NVIDIA H100 80GB HBM3",
        memory_total=80 * GIB,
        memory_used=(61 if busy else 1) * GIB,
        util_gpu=93 if busy else 2,
        util_memory=41 if busy else 0,
        temperature=67 if busy else 33,
        power_mw=612_500 if busy else 71_250,
        power_limit_mw=700_000,
        power_limit_range_mw=(200_000, 700_000),
        energy_mj=3_600_000_000 + index * 1000,
        clocks={_G: 1980 if busy else 345, _SM: 1980 if busy else 345, _MEM: 2619, _VID: 1755},
        max_clocks={_G: 1980, _SM: 1980, _MEM: 2619, _VID: 1755},
        min_graphics_mhz=345,
        clock_event_reasons=0 if busy else nvml.CLOCK_EVENT_REASONS["gpu_idle"],
        pstate=0,
        ecc={_ECC_CORR_VOL: index, _ECC_CORR_AGG: 3 * index},
        processes=[FakeProcess(pid=4100 + index, usedGpuMemory=60 * GIB)] if busy else [],
        mig_enabled=False,
    )


def fake_reset(fake: FakeNvml) -> GpuReset:
    """The node agent's GPU reset on ``fake`` (``FakeNvml.reset_gpu``), refused as
    ``nvidia-smi --gpu-reset`` refuses a GPU it cannot reach."""

    def reset(uuid: str) -> None:
        if not fake.reset_gpu(uuid):
            raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is not reachable")

    return reset


def healthy_h100(count: int = 8) -> FakeNvml:
    """``count`` healthy H100s (8 is a DGX/HGX H100 node)."""
    return FakeNvml([h100(i) for i in range(count)])


def mig_a100() -> FakeNvml:
    """Two A100 40GB: GPU 0 in MIG mode with three instances, GPU 1 whole."""
    gpus = []
    for index in range(2):
        gpu = FakeGpu(
            uuid=_uuid(0xA100, index),
            name="NVIDIA A100-SXM4-40GB",
            memory_total=40 * GIB,
            memory_used=12 * GIB,
            util_gpu=55,
            util_memory=20,
            temperature=48,
            power_mw=180_000,
            power_limit_mw=400_000,
            power_limit_range_mw=(100_000, 400_000),
            clocks={_G: 1410, _SM: 1410, _MEM: 1215, _VID: 1275},
            max_clocks={_G: 1410, _SM: 1410, _MEM: 1215, _VID: 1275},
            min_graphics_mhz=210,
            mig_enabled=index == 0,
        )
        gpus.append(gpu)
    gpus[0].mig = [
        FakeMig(
            1,
            0,
            "MIG-7c3e1f0a-0001-5d2b-8e6f-000000000001",
            "3g.20gb",
            20 * GIB,
            9 * GIB,
            [FakeProcess(pid=7001, usedGpuMemory=9 * GIB, gpuInstanceId=1, computeInstanceId=0)],
        ),
        FakeMig(5, 0, "MIG-7c3e1f0a-0005-5d2b-8e6f-000000000005", "2g.10gb", 10 * GIB, 0),
        FakeMig(
            13,
            0,
            "MIG-7c3e1f0a-000d-5d2b-8e6f-00000000000d",
            "1g.5gb",
            5 * GIB,
            3 * GIB,
            [FakeProcess(pid=7013, usedGpuMemory=3 * GIB, gpuInstanceId=13, computeInstanceId=0)],
        ),
    ]
    return FakeNvml(gpus)


def gpu_lost(after_reads: int = 2) -> FakeNvml:
    """Eight H100s; GPU 3 falls off the bus (XID 79) on its ``after_reads``-th utilization read."""
    fake = healthy_h100(8)
    fake.gpus[3].lose_after_reads = after_reads
    return fake


def old_driver() -> FakeNvml:
    """Four V100s on a 418 driver: no energy counter, no row remapping, no clock event reasons
    (only the older throttle-reasons call), no PCIe replay counter, no MIG."""
    fake = FakeNvml([h100(i) for i in range(4)], driver_version="418.226.00")
    for i, gpu in enumerate(fake.gpus):
        gpu.name = "Tesla V100-SXM2-16GB"
        gpu.uuid = _uuid(0x0100, i)
        gpu.memory_total, gpu.memory_used = 16 * GIB, min(gpu.memory_used, 15 * GIB)
        gpu.mig_enabled = None
        gpu.unsupported |= {
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetPcieReplayCounter",
        }
    fake.missing_functions |= {"nvmlDeviceGetCurrentClocksEventReasons"}
    return fake


def no_permission() -> FakeNvml:
    """Eight healthy H100s, but the exporter does not run as root: control calls are refused."""
    fake = healthy_h100(8)
    fake.no_permission = True
    return fake


def library_missing() -> FakeNvml:
    """A node without the NVIDIA driver: ``nvmlInit`` raises ``LibraryNotFound``."""
    fake = FakeNvml([])
    fake.library_missing = True
    return fake


SCENARIOS: dict[str, Callable[[], FakeNvml]] = {
    "healthy-8xh100": healthy_h100,
    "mig-a100": mig_a100,
    "gpu-lost": gpu_lost,
    "old-driver": old_driver,
    "no-permission": no_permission,
    "library-missing": library_missing,
}
"""Scenario name -> builder; ``--fake-nvml`` accepts these names."""
