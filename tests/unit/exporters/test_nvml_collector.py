"""The NVML collector against the fake NVML scenarios (and real pynvml without a driver)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from gpuops.exporters.nvml import nvml, scenarios
from gpuops.exporters.nvml.collector import NvmlCollector
from gpuops.exporters.nvml.events import XidWatcher
from gpuops.exporters.nvml.fake import FakeNvml
from gpuops.exporters.nvml.session import NvmlSession
from tests.waiting import wait_for

GIB = 2**30


def build(
    fake: nvml.Backend, xids: bool = False
) -> tuple[CollectorRegistry, NvmlSession, XidWatcher | None]:
    session = NvmlSession(fake)
    watcher = XidWatcher(session, poll_ms=20) if xids else None
    registry = CollectorRegistry()
    registry.register(NvmlCollector(session, watcher))
    return registry, session, watcher


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in registry.collect()
        for s in fam.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, **labels: str
) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def names(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], gpu: str | None = None
) -> set[str]:
    return {n for (n, labels) in samples if gpu is None or ("gpu", gpu) in labels}


def test_registering_touches_no_nvml() -> None:
    fake = scenarios.healthy_h100()
    registry, session, _ = build(fake)
    assert fake.calls == 0
    assert not session.initialized
    scrape(registry)
    assert fake.calls > 0


def test_healthy_h100_reports_every_gpu_in_base_units() -> None:
    registry, _, _ = build(scenarios.healthy_h100())
    s = scrape(registry)
    uuid = "GPU-00005100-0000-4a1b-9c2d-000000000000"
    g0 = {"gpu": "0", "uuid": uuid}
    assert value(s, "nvml_exporter_up") == 1.0
    assert value(s, "nvml_exporter_gpus", state="up") == 8.0
    for i in range(8):
        assert sum(1 for (n, lab) in s if n == "nvml_gpu_up" and ("gpu", str(i)) in lab) == 1
    info = dict(g0, name="NVIDIA H100 80GB HBM3", driver_version="550.54.15", minor_number="0")
    assert value(s, "nvml_gpu_info", **info) == 1.0
    assert value(s, "nvml_gpu_utilization_ratio", **g0) == 0.93
    assert value(s, "nvml_gpu_memory_utilization_ratio", **g0) == 0.41
    assert value(s, "nvml_gpu_memory_total_bytes", **g0) == 80 * GIB
    assert value(s, "nvml_gpu_memory_used_bytes", **g0) == 61 * GIB
    assert value(s, "nvml_gpu_memory_free_bytes", **g0) == 19 * GIB
    assert value(s, "nvml_gpu_temperature_celsius", **g0) == 67
    assert value(s, "nvml_gpu_power_usage_watts", **g0) == 612.5
    assert value(s, "nvml_gpu_power_limit_watts", **g0) == 700.0
    assert (value(s, "nvml_gpu_energy_joules_total", **g0) or 0) >= 3_600_000
    assert value(s, "nvml_gpu_clock_hertz", **g0, clock="sm") == 1.98e9
    assert value(s, "nvml_gpu_clock_max_hertz", **g0, clock="memory") == 2.619e9
    assert value(s, "nvml_gpu_clock_event_reason_active", **g0, reason="gpu_idle") == 0.0
    g1 = {"gpu": "1", "uuid": "GPU-00005100-0001-4a1b-9c2d-000000000001"}
    assert value(s, "nvml_gpu_clock_event_reason_active", **g1, reason="gpu_idle") == 1.0
    assert value(s, "nvml_gpu_performance_state", **g0) == 0.0
    assert value(s, "nvml_gpu_ecc_errors_total", **g1, error="corrected", counter="aggregate") == 3
    assert value(s, "nvml_gpu_remapped_rows", **g0, cause="uncorrectable") == 0.0
    assert value(s, "nvml_gpu_processes", **g0) == 1.0
    assert value(s, "nvml_gpu_processes", **g1) == 0.0
    assert value(s, "nvml_gpu_pcie_replays_total", **g0) == 0.0
    assert (value(s, "nvml_exporter_scrape_duration_seconds") or -1) >= 0
    assert "nvml_exporter_collection_errors_total" not in names(s)


def test_mig_instances_carry_gpu_instance_id_and_unsupported_readings_are_omitted() -> None:
    registry, _, _ = build(scenarios.mig_a100())
    s = scrape(registry)
    parent = {"gpu": "0", "uuid": "GPU-0000a100-0000-4a1b-9c2d-000000000000"}
    # utilization is not supported on a GPU in MIG mode: omitted, never 0
    assert value(s, "nvml_gpu_utilization_ratio", **parent) is None
    assert (
        value(
            s,
            "nvml_gpu_utilization_ratio",
            gpu="1",
            uuid="GPU-0000a100-0001-4a1b-9c2d-000000000001",
        )
        == 0.55
    )
    assert value(s, "nvml_gpu_memory_total_bytes", **parent, gpu_instance_id="1") == 20 * GIB
    assert value(s, "nvml_gpu_memory_used_bytes", **parent, gpu_instance_id="13") == 3 * GIB
    assert value(s, "nvml_gpu_processes", **parent, gpu_instance_id="5") == 0.0
    mig_info = dict(
        parent,
        gpu_instance_id="1",
        compute_instance_id="0",
        mig_uuid="MIG-7c3e1f0a-0001-5d2b-8e6f-000000000001",
        name="NVIDIA A100-SXM4-40GB MIG 3g.20gb",
    )
    assert value(s, "nvml_gpu_mig_info", **mig_info) == 1.0
    assert sum(1 for (n, _) in s if n == "nvml_gpu_mig_info") == 3
    assert "nvml_exporter_collection_errors_total" not in names(s)


def test_a_gpu_falling_off_the_bus_reports_up_0_and_the_others_keep_reporting() -> None:
    fake = scenarios.gpu_lost(after_reads=2)
    registry, _, watcher = build(fake, xids=True)
    assert watcher is not None
    first = scrape(registry)
    assert value(first, "nvml_exporter_gpus", state="up") == 8.0
    watcher.start()
    try:
        wait_for(lambda: watcher.watching == 8)
        second = scrape(registry)  # GPU 3 falls off the bus during this scrape
        lost = {"gpu": "3", "uuid": "GPU-00005100-0003-4a1b-9c2d-000000000003"}
        assert value(second, "nvml_gpu_up", **lost) == 0.0
        assert names(second, gpu="3") <= {
            "nvml_gpu_up",
            "nvml_gpu_info",
            "nvml_gpu_xid_errors_total",
        }
        assert value(second, "nvml_exporter_gpus", state="lost") == 1.0
        assert value(second, "nvml_exporter_up") == 1.0
        for i in (0, 1, 2, 4, 5, 6, 7):
            assert value(second, "nvml_gpu_up", gpu=str(i), uuid=fake.gpus[i].uuid) == 1.0
            assert "nvml_gpu_utilization_ratio" in names(second, gpu=str(i))
        assert value(second, "nvml_exporter_collection_errors_total", error="GpuIsLost") == 1.0
        wait_for(
            lambda: value(scrape(registry), "nvml_gpu_xid_errors_total", **lost, xid="79") == 1.0
        )
        before = value(scrape(registry), "nvml_exporter_collection_errors_total", error="GpuIsLost")
        third = scrape(registry)
        assert value(third, "nvml_gpu_up", **lost) == 0.0
        after = value(third, "nvml_exporter_collection_errors_total", error="GpuIsLost")
        assert after == (before or 0) + 1
    finally:
        watcher.stop()


def test_xid_events_are_counted_per_code() -> None:
    fake = scenarios.healthy_h100(2)
    registry, _, watcher = build(fake, xids=True)
    assert watcher is not None
    watcher.start()
    try:
        wait_for(lambda: watcher.watching == 2)
        for xid in (48, 48, 13):
            fake.inject_xid(1, xid)
        g1 = {"gpu": "1", "uuid": fake.gpus[1].uuid}
        wait_for(
            lambda: value(scrape(registry), "nvml_gpu_xid_errors_total", **g1, xid="13") == 1.0
        )
        s = scrape(registry)
        assert value(s, "nvml_gpu_xid_errors_total", **g1, xid="48") == 2.0
        assert not any(n == "nvml_gpu_xid_errors_total" and ("gpu", "0") in lab for (n, lab) in s)
    finally:
        watcher.stop()


def test_old_driver_omits_what_it_lacks_and_falls_back_to_throttle_reasons() -> None:
    registry, _, _ = build(scenarios.old_driver())
    s = scrape(registry)
    for missing in (
        "nvml_gpu_energy_joules_total",
        "nvml_gpu_remapped_rows",
        "nvml_gpu_remapped_rows_pending",
        "nvml_gpu_pcie_replays_total",
        "nvml_gpu_mig_info",
    ):
        assert missing not in names(s), missing
    g1 = {"gpu": "1", "uuid": "GPU-00000100-0001-4a1b-9c2d-000000000001"}
    assert value(s, "nvml_gpu_clock_event_reason_active", **g1, reason="gpu_idle") == 1.0
    assert value(s, "nvml_gpu_power_usage_watts", **g1) == 71.25
    assert "nvml_exporter_collection_errors_total" not in names(s)


def test_other_nvml_errors_omit_one_reading_and_are_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = scenarios.healthy_h100(2)

    def broken(handle: object, sensor: int) -> int:
        raise nvml.Unknown()

    monkeypatch.setattr(fake, "nvmlDeviceGetTemperature", broken)
    registry, _, _ = build(fake)
    s = scrape(registry)
    assert "nvml_gpu_temperature_celsius" not in names(s)
    assert value(s, "nvml_gpu_up", gpu="0", uuid=fake.gpus[0].uuid) == 1.0
    assert value(s, "nvml_exporter_collection_errors_total", error="Unknown") == 2.0


@pytest.mark.parametrize(
    "error", [nvml.LibRmVersionMismatch, nvml.Uninitialized, nvml.DriverNotLoaded]
)
def test_driver_level_errors_reinitialise_nvml_on_the_next_scrape(error: type[Exception]) -> None:
    fake = scenarios.healthy_h100(2)
    registry, session, _ = build(fake)
    assert value(scrape(registry), "nvml_exporter_up") == 1.0
    fake.break_driver(error)
    broken = scrape(registry)
    assert value(broken, "nvml_exporter_up") == 0.0
    assert (
        value(broken, "nvml_exporter_collection_errors_total", error=nvml.error_name(error()))
        == 1.0
    )
    again = scrape(registry)
    assert value(again, "nvml_exporter_up") == 1.0
    assert value(again, "nvml_exporter_reinitializations_total") == 1.0
    assert value(again, "nvml_gpu_utilization_ratio", gpu="0", uuid=fake.gpus[0].uuid) == 0.93
    assert session.generation == 2


def _check_library_missing(backend: nvml.Backend, caplog: pytest.LogCaptureFixture) -> None:
    registry, session, _ = build(backend)
    with caplog.at_level(logging.ERROR, logger="gpuops.exporters.nvml"):
        for _ in range(3):
            s = scrape(registry)
            assert value(s, "nvml_exporter_up") == 0.0
            assert value(s, "nvml_exporter_gpus", state="up") == 0.0
            assert "nvml_gpu_up" not in names(s)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert lines == [
        "NVML library libnvidia-ml.so.1 not found (is the NVIDIA driver installed?): "
        "exporting nvml_exporter_up 0 and trying again on every scrape"
    ]
    assert not session.initialized


def test_library_missing_fake_reports_unhealthy_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _check_library_missing(scenarios.library_missing(), caplog)


def test_real_pynvml_without_a_driver_reports_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    backend = nvml.real_backend()
    try:
        backend.nvmlInit()
    except nvml.LibraryNotFound:
        pass
    else:  # pragma: no cover - only on a machine with an NVIDIA driver
        backend.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    _check_library_missing(backend, caplog)


def test_library_appearing_later_is_picked_up() -> None:
    fake = scenarios.healthy_h100(1)
    fake.library_missing = True
    registry, _, _ = build(fake)
    assert value(scrape(registry), "nvml_exporter_up") == 0.0
    fake.library_missing = False
    assert value(scrape(registry), "nvml_exporter_up") == 1.0


def test_fake_returns_pynvml_types_and_units() -> None:
    fake: FakeNvml = scenarios.healthy_h100(1)
    with pytest.raises(nvml.Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    util = fake.nvmlDeviceGetUtilizationRates(handle)
    assert isinstance(util, nvml.Utilization) and (util.gpu, util.memory) == (93, 41)
    mem = fake.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(mem, nvml.Memory) and mem.total == mem.used + mem.free
    assert fake.nvmlDeviceGetPowerUsage(handle) == 612_500  # milliwatts
    assert fake.nvmlDeviceGetClockInfo(handle, nvml.CLOCKS["graphics"]) == 1980  # MHz
    assert isinstance(fake.nvmlDeviceGetUUID(handle), str)
    with pytest.raises(nvml.InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(5)
    with pytest.raises(nvml.NVMLError):  # pynvml's base class catches the fake's errors
        fake.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    fake.nvmlShutdown()


def test_an_ordinary_error_while_enumerating_is_retried_and_xids_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = scenarios.healthy_h100(2)
    real_count = fake.nvmlDeviceGetCount
    failures = iter([nvml.Unknown()])

    def flaky_count() -> int:
        error = next(failures, None)
        if error is not None:
            raise error
        return real_count()

    monkeypatch.setattr(fake, "nvmlDeviceGetCount", flaky_count)
    registry, session, watcher = build(fake, xids=True)
    assert watcher is not None
    watcher.start()  # its first look at the GPUs meets the error
    try:
        wait_for(lambda: watcher.watching == 2, what="the XID watcher to recover")
        fake.inject_xid(0, 31)
        g0 = {"gpu": "0", "uuid": fake.gpus[0].uuid}
        wait_for(lambda: value(scrape(registry), "nvml_gpu_xid_errors_total", **g0, xid="31"))
        assert value(scrape(registry), "nvml_exporter_up") == 1.0
    finally:
        watcher.stop()
    assert session.initialized


def test_info_carries_the_device_minor_number_not_the_index() -> None:
    """Slurm's GRES order follows /dev/nvidiaN: the join key must be the minor number."""
    fake = scenarios.healthy_h100()
    fake.gpus[0].minor_number, fake.gpus[1].minor_number = 1, 0
    registry, _, _ = build(fake)
    infos = {
        dict(lab)["gpu"]: dict(lab).get("minor_number")
        for (n, lab) in scrape(registry)
        if n == "nvml_gpu_info"
    }
    assert infos["0"] == "1" and infos["1"] == "0" and infos["2"] == "2"


def test_info_omits_the_minor_number_where_nvml_does_not_support_it() -> None:
    fake = scenarios.healthy_h100()
    fake.gpus[0].unsupported.add("nvmlDeviceGetMinorNumber")
    registry, _, _ = build(fake)
    info = [dict(lab) for (n, lab) in scrape(registry) if n == "nvml_gpu_info"]
    assert "minor_number" not in next(i for i in info if i["gpu"] == "0")
    assert next(i for i in info if i["gpu"] == "1")["minor_number"] == "1"
