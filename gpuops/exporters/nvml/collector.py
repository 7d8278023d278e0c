"""The NVML collector: reads NVML on each scrape and yields the ``nvml_*`` families
(docs/reference/metrics.md) in base units. ``gpuops.exporters.nvml.server`` registers it in the
exporter's own ``CollectorRegistry`` (for ``describe()``, which touches no NVML, and for any
caller of ``collect()``); the server's ``/metrics`` calls ``render()``, which writes the text
exposition itself — the same bytes as ``generate_latest`` (a test compares them), at a fraction
of the cost: each GPU's label text is escaped and sorted once and reused on every scrape, and no
``Metric``/``Sample`` objects are built (prometheus_client's generic path, which validates and
escapes every label of every sample, was 72% of a scrape).

Failure rules: a reading NVML does not support (``NotSupported``, ``FunctionNotFound``) is
omitted; a lost GPU reports ``nvml_gpu_up 0`` and nothing else while the others keep reporting;
a driver-level error ends the scrape's GPU part and re-initialises NVML on the next scrape; any
other NVML error omits that one reading and is counted in
``nvml_exporter_collection_errors_total{error}``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gpuops.exporters.nvml import nvml
from gpuops.exporters.nvml.events import XidWatcher
from gpuops.exporters.nvml.session import Device, NvmlSession

# (sample name, type, help). Counters end in _total; their family name drops it.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    (
        "nvml_gpu_info",
        "gauge",
        "GPU identity; always 1. Join on uuid (indexes change across reboots).",
    ),
    ("nvml_gpu_mig_info", "gauge", "MIG device identity (GPU instance on a parent GPU); always 1."),
    ("nvml_gpu_up", "gauge", "1 if the GPU answers NVML, 0 if it is lost (e.g. fell off the bus)."),
    (
        "nvml_gpu_utilization_ratio",
        "gauge",
        "Fraction of the last sample period a kernel ran (0-1).",
    ),
    (
        "nvml_gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of the last sample period device memory was read or written (0-1).",
    ),
    (
        "nvml_gpu_memory_total_bytes",
        "gauge",
        "Device memory installed (of the MIG instance if set).",
    ),
    ("nvml_gpu_memory_used_bytes", "gauge", "Device memory allocated."),
    ("nvml_gpu_memory_free_bytes", "gauge", "Device memory not allocated."),
    ("nvml_gpu_temperature_celsius", "gauge", "GPU core temperature."),
    ("nvml_gpu_power_usage_watts", "gauge", "Power drawn by the board."),
    ("nvml_gpu_energy_joules_total", "counter", "Energy consumed since the driver was loaded."),
    ("nvml_gpu_power_limit_watts", "gauge", "Enforced power limit."),
    ("nvml_gpu_clock_hertz", "gauge", "Current clock frequency, by clock domain."),
    ("nvml_gpu_clock_max_hertz", "gauge", "Highest clock frequency the GPU supports, by domain."),
    (
        "nvml_gpu_clock_event_reason_active",
        "gauge",
        "1 if this reason currently holds the clocks down (idle, power cap, thermal, ...).",
    ),
    ("nvml_gpu_performance_state", "gauge", "Performance state: 0 (P0, fastest) to 15 (slowest)."),
    (
        "nvml_gpu_ecc_errors_total",
        "counter",
        "ECC errors: error=corrected|uncorrected, counter=volatile (since driver load)|aggregate.",
    ),
    (
        "nvml_gpu_remapped_rows",
        "gauge",
        "Memory rows remapped, by cause (correctable|uncorrectable).",
    ),
    ("nvml_gpu_remapped_rows_pending", "gauge", "1 if a row remapping waits for a GPU reset."),
    ("nvml_gpu_remapped_rows_failed", "gauge", "1 if a row remapping failed (replace the GPU)."),
    ("nvml_gpu_xid_errors_total", "counter", "XID critical error events seen, by XID code."),
    ("nvml_gpu_processes", "gauge", "Processes running on the GPU (compute and graphics)."),
    ("nvml_gpu_pcie_replays_total", "counter", "PCIe replays (link errors retried)."),
    ("nvml_exporter_up", "gauge", "1 if NVML is initialised and readable, else 0."),
    ("nvml_exporter_gpus", "gauge", "GPUs seen by NVML, by state (up|lost)."),
    ("nvml_exporter_scrape_duration_seconds", "gauge", "Time this scrape spent reading NVML."),
    (
        "nvml_exporter_collection_errors_total",
        "counter",
        "NVML errors while collecting, by error (NotSupported is not an error).",
    ),
    ("nvml_exporter_reinitializations_total", "counter", "Times NVML was initialised again."),
)

_LOST = object()  # a reading raised GpuIsLost
_go = cast(Callable[[float], str], floatToGoString)  # sample values as generate_latest writes them
_INF = float("inf")

Pairs = tuple[tuple[str, str], ...]
"""Labels as (name, value) pairs; the extra labels of a reading are constants where they can be."""

_HEADERS: dict[str, str] = {
    sample: "# HELP {0} {1}\n# TYPE {0} {2}\n".format(
        sample, doc.replace("\\", r"\\").replace("\n", r"\n"), typ
    )
    for sample, typ, doc in FAMILIES
}
"""The HELP and TYPE lines of each family, as ``generate_latest`` writes them."""

_CLOCK_LABELS: dict[str, Pairs] = {clock: (("clock", clock),) for clock in nvml.CLOCKS}
_REASON_LABELS: dict[str, Pairs] = {r: (("reason", r),) for r in nvml.CLOCK_EVENT_REASONS}
_ECC_LABELS: dict[tuple[str, str], Pairs] = {
    (error, counter): (("counter", counter), ("error", error))
    for error in nvml.ECC_ERRORS
    for counter in nvml.ECC_COUNTERS
}
_ROWS_LABELS: dict[str, Pairs] = {c: (("cause", c),) for c in ("correctable", "uncorrectable")}


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class LabelText:
    """Label sets rendered once: ``{a="1",b="2"}`` (sorted by name, escaped) and the dict that
    ``collect()`` hands prometheus_client, cached by (base, extra) pairs. Bounded: the cache is
    dropped when it grows past ``limit`` (GPUs come and go; XID codes are few)."""

    def __init__(self, limit: int = 50_000) -> None:
        self._cache: dict[tuple[Pairs, Pairs], tuple[str, dict[str, str]]] = {}
        self._limit = limit

    def get(self, base: Pairs, extra: Pairs = ()) -> tuple[str, dict[str, str]]:
        key = (base, extra)
        found = self._cache.get(key)
        if found is None:
            labels = dict(base)
            labels.update(extra)
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            found = ("{" + text + "}" if text else "", labels)
            if len(self._cache) >= self._limit:
                self._cache.clear()
            self._cache[key] = found
        return found


Rows = dict[str, list[tuple[tuple[str, dict[str, str]], float]]]
"""One scrape: per sample name, (label text and dict, value) in the order they were read."""


class NvmlCollector:
    """A prometheus_client custom collector over one ``NvmlSession``."""

    def __init__(
        self,
        session: NvmlSession,
        xids: XidWatcher | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.session = session
        self.xids = xids
        self.on_lost = on_lost
        """Told the UUID of a GPU the first scrape it stops answering (the health push)."""
        self._lost: set[str] = set()
        self._clock = clock
        self._errors: dict[str, int] = {}
        self._lock = threading.Lock()
        self._labels = LabelText()
        self._values: dict[float, str] = {}

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def _seen_alive(self, uuid: str, alive: bool) -> None:
        if alive:
            self._lost.discard(uuid)
        elif uuid not in self._lost:
            self._lost.add(uuid)
            if self.on_lost is not None:
                self.on_lost(uuid)

    def collect(self) -> Iterator[Metric]:
        """The scrape as prometheus_client families (what a registry asks for)."""
        fams = self._families()
        for name, rows in self._gather().items():
            samples = fams[name].samples
            for (_, labels), value in rows:
                samples.append(Sample(name, labels, value))
        return iter([fam for fam in fams.values() if fam.samples])

    def render(self) -> bytes:
        """The scrape in the Prometheus text format (0.0.4), as ``generate_latest`` writes it."""
        rows = self._gather()
        out: list[str] = []
        for name, header in _HEADERS.items():
            found = rows.get(name)
            if not found:
                continue
            out.append(header)
            for (text, _), value in found:
                # what floatToGoString returns, without calling it for the common case: repr
                # below 1e6 (Go switches to exponents above), the cache for large values
                if -_INF < value < 1e6:
                    out.append(f"{name}{text} {value!r}\n")
                else:
                    out.append(f"{name}{text} {self._large_value_text(value)}\n")
        return "".join(out).encode()

    def _large_value_text(self, value: float) -> str:
        """``floatToGoString(value)``, cached: large values (totals, clocks in Hz) repeat."""
        text = self._values.get(value)
        if text is None:
            text = _go(value)
            if len(self._values) >= 4096:
                self._values.clear()
            self._values[value] = text
        return text

    def _gather(self) -> Rows:
        """Read NVML once: every sample of this scrape, by sample name."""
        started = self._clock()
        label = self._labels.get
        rows: Rows = {name: [] for name, _, _ in FAMILIES}
        devices = self.session.devices()
        ok = devices is not None
        up = lost = 0
        for dev in devices or ():
            try:
                samples = self._read_gpu(dev)
            except nvml.DRIVER_LEVEL as exc:
                self._count_error(exc)
                self.session.invalidate(exc)
                ok = False
                break
            base: Pairs = (("gpu", str(dev.index)), ("uuid", dev.uuid))
            if dev.name:
                info: Pairs = (("name", dev.name), ("driver_version", self.session.driver_version))
                if dev.minor_number is not None:  # the join key of Slurm's GRES index
                    info += (("minor_number", str(dev.minor_number)),)
                rows["nvml_gpu_info"].append((label(base, info), 1.0))
            alive = samples is not None
            rows["nvml_gpu_up"].append((label(base), float(alive)))
            self._seen_alive(dev.uuid, alive)
            if samples is None:
                lost += 1
                continue
            up += 1
            for name, extra, value in samples:
                rows[name].append((label(base, extra), value))
        if self.xids is not None:
            for (gpu, uuid, xid), count in sorted(self.xids.counts().items()):
                xid_labels = label((("gpu", gpu), ("uuid", uuid)), (("xid", xid),))
                rows["nvml_gpu_xid_errors_total"].append((xid_labels, float(count)))
        rows["nvml_exporter_up"].append((label(()), float(ok)))
        for state, count in (("up", up), ("lost", lost)):
            rows["nvml_exporter_gpus"].append((label((("state", state),)), float(count)))
        with self._lock:
            errors = dict(self._errors)
        for error, n in sorted(errors.items()):
            rows["nvml_exporter_collection_errors_total"].append(
                (label((("error", error),)), float(n))
            )
        reinits = float(self.session.reinitializations)
        rows["nvml_exporter_reinitializations_total"].append((label(()), reinits))
        elapsed = self._clock() - started
        rows["nvml_exporter_scrape_duration_seconds"].append((label(()), elapsed))
        return rows

    @staticmethod
    def _families() -> dict[str, Metric]:
        return {
            sample: Metric(sample.removesuffix("_total") if typ == "counter" else sample, doc, typ)
            for sample, typ, doc in FAMILIES
        }

    def _count_error(self, exc: BaseException) -> None:
        with self._lock:
            name = nvml.error_name(exc)
            self._errors[name] = self._errors.get(name, 0) + 1

    def _call(self, function: str, *args: Any) -> Any:
        """One NVML reading: None when unsupported or failed (counted), _LOST when the GPU is lost.
        Driver-level errors propagate."""
        try:
            return getattr(self.session.backend, function)(*args)
        except nvml.UNSUPPORTED:
            return None
        except nvml.NotFound:  # e.g. an empty MIG slot
            return None
        except nvml.GpuIsLost:
            return _LOST
        except nvml.DRIVER_LEVEL:
            raise
        except nvml.NVMLError as exc:
            self._count_error(exc)
            return None

    def _read_gpu(self, dev: Device) -> list[tuple[str, Pairs, float]] | None:
        """Every reading of one GPU as (sample name, extra labels, value); None if it is lost."""
        if dev.handle is None:
            self._count_error(nvml.GpuIsLost())
            return None
        reader = _GpuReader(self._call, self.session.backend, self._count_error, dev.handle)
        if not reader.read():
            self._count_error(nvml.GpuIsLost())
            return None
        return reader.out


class _GpuReader:
    """Reads one GPU (and its MIG devices) into ``out``; ``read()`` is False if the GPU is lost."""

    def __init__(
        self,
        call: Callable[..., Any],
        backend: Any,
        count_error: Callable[[BaseException], None],
        handle: Any,
    ) -> None:
        self.call = call
        self.backend = backend
        self.count_error = count_error
        self.handle = handle
        self.out: list[tuple[str, Pairs, float]] = []
        self.lost = False

    def get(self, function: str, *args: Any) -> Any:
        """One reading of this GPU (``NvmlCollector._call`` inlined: it runs ~40 times per GPU
        per scrape): None when unsupported or failed (counted), or when the GPU is lost."""
        try:
            return getattr(self.backend, function)(self.handle, *args)
        except nvml.UNSUPPORTED:
            return None
        except nvml.NotFound:
            return None
        except nvml.GpuIsLost:
            self.lost = True
            return None
        except nvml.DRIVER_LEVEL:
            raise
        except nvml.NVMLError as exc:
            self.count_error(exc)
            return None

    def put(self, metric: str, value: float | None, labels: Pairs = ()) -> None:
        if value is not None:
            self.out.append((metric, labels, float(value)))

    def read(self) -> bool:
        get, put = self.get, self.put
        util = get("nvmlDeviceGetUtilizationRates")
        if util is not None:
            put("nvml_gpu_utilization_ratio", util.gpu / 100)
            put("nvml_gpu_memory_utilization_ratio", util.memory / 100)
        self._memory(get("nvmlDeviceGetMemoryInfo"))
        put("nvml_gpu_temperature_celsius", get("nvmlDeviceGetTemperature", nvml.TEMPERATURE_GPU))
        power = get("nvmlDeviceGetPowerUsage")
        put("nvml_gpu_power_usage_watts", None if power is None else power / 1000)
        energy = get("nvmlDeviceGetTotalEnergyConsumption")
        put("nvml_gpu_energy_joules_total", None if energy is None else energy / 1000)
        limit = get("nvmlDeviceGetEnforcedPowerLimit")
        put("nvml_gpu_power_limit_watts", None if limit is None else limit / 1000)
        if self.lost:
            return False
        for clock, kind in nvml.CLOCKS.items():
            mhz = get("nvmlDeviceGetClockInfo", kind)
            put("nvml_gpu_clock_hertz", None if mhz is None else mhz * 1e6, _CLOCK_LABELS[clock])
            top = get("nvmlDeviceGetMaxClockInfo", kind)
            put(
                "nvml_gpu_clock_max_hertz", None if top is None else top * 1e6, _CLOCK_LABELS[clock]
            )
        self._reasons()
        put("nvml_gpu_performance_state", get("nvmlDeviceGetPerformanceState"))
        for error, etype in nvml.ECC_ERRORS.items():
            for counter, ctype in nvml.ECC_COUNTERS.items():
                count = get("nvmlDeviceGetTotalEccErrors", etype, ctype)
                put("nvml_gpu_ecc_errors_total", count, _ECC_LABELS[error, counter])
        rows = get("nvmlDeviceGetRemappedRows")
        if rows is not None:
            put("nvml_gpu_remapped_rows", rows[0], _ROWS_LABELS["correctable"])
            put("nvml_gpu_remapped_rows", rows[1], _ROWS_LABELS["uncorrectable"])
            put("nvml_gpu_remapped_rows_pending", 1 if rows[2] else 0)
            put("nvml_gpu_remapped_rows_failed", 1 if rows[3] else 0)
        put("nvml_gpu_pcie_replays_total", get("nvmlDeviceGetPcieReplayCounter"))
        self._processes(self.handle, ())
        self._mig()
        return not self.lost

    def _memory(self, mem: Any, labels: Pairs = ()) -> None:
        if mem is not None:
            self.put("nvml_gpu_memory_total_bytes", mem.total, labels)
            self.put("nvml_gpu_memory_used_bytes", mem.used, labels)
            self.put("nvml_gpu_memory_free_bytes", mem.free, labels)

    def _reasons(self) -> None:
        reasons = self.get("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None and not self.lost:  # drivers before 535 only have the old name
            reasons = self.get("nvmlDeviceGetCurrentClocksThrottleReasons")
        if reasons is not None:
            for reason, bit in nvml.CLOCK_EVENT_REASONS.items():
                self.put(
                    "nvml_gpu_clock_event_reason_active",
                    1 if reasons & bit else 0,
                    _REASON_LABELS[reason],
                )

    def _processes(self, handle: Any, labels: Pairs) -> None:
        compute = self.call("nvmlDeviceGetComputeRunningProcesses", handle)
        graphics = self.call("nvmlDeviceGetGraphicsRunningProcesses", handle)
        if compute is _LOST or graphics is _LOST:
            self.lost = True
            return
        if compute is None and graphics is None:
            return
        pids = {p.pid for p in (compute or [])} | {p.pid for p in (graphics or [])}
        self.put("nvml_gpu_processes", len(pids), labels)

    def _mig(self) -> None:
        mode = self.get("nvmlDeviceGetMigMode")
        if mode is None or mode[0] != nvml.DEVICE_MIG_ENABLE:
            return
        for slot in range(self.get("nvmlDeviceGetMaxMigDeviceCount") or 0):
            mig = self.get("nvmlDeviceGetMigDeviceHandleByIndex", slot)
            if mig is None:
                continue
            gi = self.call("nvmlDeviceGetGpuInstanceId", mig)
            ci = self.call("nvmlDeviceGetComputeInstanceId", mig)
            uuid = self.call("nvmlDeviceGetUUID", mig)
            name = self.call("nvmlDeviceGetName", mig)
            if _LOST in (gi, ci, uuid, name):
                self.lost = True
                return
            if gi is None:
                continue
            labels: Pairs = (("gpu_instance_id", str(gi)),)
            info = (
                ("compute_instance_id", str(ci)),
                ("mig_uuid", str(uuid or "")),
                ("name", str(name or "")),
            )
            self.put("nvml_gpu_mig_info", 1, labels + info)
            mem = self.call("nvmlDeviceGetMemoryInfo", mig)
            self._memory(None if mem is _LOST else mem, labels)
            self._processes(mig, labels)
