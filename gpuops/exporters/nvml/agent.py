"""The node agent: locks and resets GPU clocks and sets power limits through NVML, resets a
GPU (``nvidia-smi --gpu-reset``: NVML has no reset of its own) and checks a GPU's health, for
the engine's ``nvml-agent`` executor.

``gpuops.exporters.nvml.server`` exposes it over authenticated HTTP when the exporter runs with
``--agent``. Every request is validated against what the GPU supports before NVML is called,
every change is logged and counted, the locked clock range is exported as
``nvml_gpu_clock_locked_hertz{bound}``, and a repeated decision id is answered from memory
without touching NVML a second time (idempotency).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from gpuops.exporters.nvml import nvml
from gpuops.exporters.nvml.session import Device, NvmlSession

log = logging.getLogger(__name__)


class AgentError(Exception):
    """A refused request: ``status`` is the HTTP status the server answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


RESET_TIMEOUT_S = 120.0
"""Seconds ``nvidia-smi --gpu-reset`` may take."""

GpuReset = Callable[[str], None]
"""Resets the GPU of a UUID; raises ``AgentError`` saying why it could not."""


def nvidia_smi_reset(uuid: str) -> None:
    """``nvidia-smi --gpu-reset -i UUID`` (the GPU must run nothing; root)."""
    argv = ["nvidia-smi", "--gpu-reset", "-i", uuid]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RESET_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise AgentError(501, "nvidia-smi is not on this node's PATH: no GPU reset") from None
    except subprocess.TimeoutExpired:
        raise AgentError(504, f"nvidia-smi --gpu-reset took over {RESET_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-256:]
        raise AgentError(409, f"nvidia-smi --gpu-reset exited {done.returncode}: {said}")


class ClockAgent:
    """Clock and power-limit control, reset and health checks of one session's GPUs;
    thread-safe."""

    def __init__(
        self, session: NvmlSession, remember: int = 4096, reset: GpuReset = nvidia_smi_reset
    ) -> None:
        """``reset``: how a GPU is reset (a fake NVML's own in tests and demos)."""
        self.session = session
        self._reset = reset
        self.remember = remember
        """How many decision ids are remembered for idempotent replays."""
        self._locked: dict[tuple[str, str], tuple[int, int]] = {}
        self._done: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self._changes: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._changing = threading.Lock()

    # --- reads ------------------------------------------------------------------------------
    def gpus(self) -> list[dict[str, Any]]:
        """What each GPU accepts: graphics clock range (MHz), power limit range (W), lock state."""
        out = []
        for dev in self._devices():
            entry: dict[str, Any] = {"gpu": dev.index, "uuid": dev.uuid, "name": dev.name}
            if dev.handle is not None:
                try:
                    entry["graphics_clock_range_mhz"] = list(self._clock_range(dev))
                    low, high = self._power_range(dev)
                    entry["power_limit_range_watts"] = [low / 1000, high / 1000]
                except AgentError as exc:
                    entry["error"] = exc.message
            with self._lock:
                locked = self._locked.get((str(dev.index), dev.uuid))
            entry["locked_clocks_mhz"] = list(locked) if locked else None
            out.append(entry)
        return out

    # --- changes ----------------------------------------------------------------------------
    def lock_clocks(
        self, ref: str, max_mhz: int, min_mhz: int | None = None, decision_id: str | None = None
    ) -> dict[str, Any]:
        """Lock GPU ``ref``'s graphics clock to [min_mhz, max_mhz] (min: lowest supported)."""

        def change(dev: Device) -> dict[str, Any]:
            low, high = self._clock_range(dev)
            floor = low if min_mhz is None else min_mhz
            if not low <= max_mhz <= high or not low <= floor <= high:
                raise AgentError(
                    400,
                    f"GPU {dev.index} ({dev.uuid}) supports graphics clocks {low}-{high} MHz; "
                    f"asked for {floor}-{max_mhz} MHz",
                )
            if floor > max_mhz:
                raise AgentError(400, f"min_clock_mhz {floor} is above max_clock_mhz {max_mhz}")
            self._nvml(dev, "nvmlDeviceSetGpuLockedClocks", floor, max_mhz)
            with self._lock:
                self._locked[(str(dev.index), dev.uuid)] = (floor, max_mhz)
            return {"min_clock_mhz": floor, "max_clock_mhz": max_mhz}

        wanted = f"{min_mhz or 'lowest'}-{max_mhz} MHz"
        return self._apply("lock_clocks", ref, decision_id, change, wanted)

    def reset_clocks(self, ref: str, decision_id: str | None = None) -> dict[str, Any]:
        """Give GPU ``ref``'s clocks back to the driver (undo ``lock_clocks``)."""

        def change(dev: Device) -> dict[str, Any]:
            self._nvml(dev, "nvmlDeviceResetGpuLockedClocks")
            with self._lock:
                previous = self._locked.pop((str(dev.index), dev.uuid), None)
            return {"previous_clocks_mhz": list(previous) if previous else None}

        return self._apply("reset_clocks", ref, decision_id, change)

    def set_power_limit(
        self, ref: str, watts: float, decision_id: str | None = None
    ) -> dict[str, Any]:
        """Set GPU ``ref``'s power limit, within its constraints."""

        def change(dev: Device) -> dict[str, Any]:
            low, high = self._power_range(dev)
            milliwatts = round(watts * 1000)
            if not low <= milliwatts <= high:
                raise AgentError(
                    400,
                    f"GPU {dev.index} ({dev.uuid}) accepts power limits {low / 1000:g}-"
                    f"{high / 1000:g} W; asked for {watts:g} W",
                )
            self._nvml(dev, "nvmlDeviceSetPowerManagementLimit", milliwatts)
            return {"power_limit_watts": milliwatts / 1000}

        return self._apply("set_power_limit", ref, decision_id, change, f"{watts:g} W")

    def reset_gpu(self, ref: str, decision_id: str | None = None) -> dict[str, Any]:
        """Reset GPU ``ref`` (a remediation step): its volatile ECC counts clear and pending
        row remappings are applied."""

        def change(dev: Device) -> dict[str, Any]:
            self._reset(dev.uuid)
            return {"reset": True}

        return self._apply("reset_gpu", ref, decision_id, change)

    def check(self, ref: str) -> dict[str, Any]:
        """GPU ``ref``'s health by NVML: lost, a row remapping pending or failed, uncorrected
        ECC errors since the driver loaded. ``healthy`` is True when none of these is found
        (what NVML cannot tell on this GPU is not a problem)."""
        devices = self._devices()
        dev = next((d for d in devices if ref in (d.uuid, str(d.index))), None)
        if dev is None:  # a GPU the engine knows and NVML does not: gone from the bus
            log.info("health check of GPU %s: not found on this node", ref)
            return {"uuid": ref, "healthy": False, "problems": ["not found on this node"]}
        problems: list[str] = []
        if dev.handle is None:
            problems.append("lost (fell off the bus?)")
        else:
            problems += self._problems(dev)
        healthy = not problems
        log.info("health check of GPU %d (%s): %s", dev.index, dev.uuid, problems or "healthy")
        return {"gpu": dev.index, "uuid": dev.uuid, "healthy": healthy, "problems": problems}

    def _problems(self, dev: Device) -> list[str]:
        backend, problems = self.session.backend, []
        try:
            rows = backend.nvmlDeviceGetRemappedRows(dev.handle)
            if rows[2]:
                problems.append("a row remapping is pending (a reset applies it)")
            if rows[3]:
                problems.append("a row remapping failed (the GPU needs replacing)")
            ecc = backend.nvmlDeviceGetTotalEccErrors(
                dev.handle, nvml.ECC_ERRORS["uncorrected"], nvml.ECC_COUNTERS["volatile"]
            )
            if ecc:
                problems.append(f"{ecc} uncorrected ECC error(s) since the driver loaded")
        except nvml.GpuIsLost:
            problems.append("lost (fell off the bus?)")
        except nvml.UNSUPPORTED:
            pass  # not a problem: NVML cannot tell on this GPU
        return problems

    # --- metrics ----------------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        locked, changes = self._families()
        with self._lock:
            for (gpu, uuid), (low, high) in sorted(self._locked.items()):
                for bound, mhz in (("min", low), ("max", high)):
                    labels = {"gpu": gpu, "uuid": uuid, "bound": bound}
                    locked.samples.append(Sample(locked.name, labels, mhz * 1e6))
            for (action, result), count in sorted(self._changes.items()):
                labels = {"action": action, "result": result}
                changes.samples.append(Sample("nvml_agent_changes_total", labels, float(count)))
        return [fam for fam in (locked, changes) if fam.samples]

    @staticmethod
    def _families() -> list[Metric]:
        return [
            Metric(
                "nvml_gpu_clock_locked_hertz",
                "Clock range locked by the node agent (bound=min|max); absent if not locked.",
                "gauge",
            ),
            Metric(
                "nvml_agent_changes",
                "Clock and power changes asked of the node agent, by action and result.",
                "counter",
            ),
        ]

    # --- helpers ----------------------------------------------------------------------------
    def _apply(
        self,
        action: str,
        ref: str,
        decision_id: str | None,
        change: Callable[[Device], dict[str, Any]],
        params: str = "",
    ) -> dict[str, Any]:
        # one change at a time: two requests with one decision id cannot both change the GPU
        with self._changing:
            return self._apply_once(action, ref, decision_id, change, params)

    def _apply_once(
        self,
        action: str,
        ref: str,
        decision_id: str | None,
        change: Callable[[Device], dict[str, Any]],
        params: str,
    ) -> dict[str, Any]:
        what = f"{action} on GPU {ref}" + (f" ({params})" if params else "")
        if decision_id:
            with self._lock:
                done = self._done.get(decision_id)
            if done is not None:
                if done[0] != what:
                    raise AgentError(
                        409, f"decision {decision_id} was already used for {done[0]}, not {what}"
                    )
                log.info(
                    "decision %s: %s on GPU %s already done; not repeated", decision_id, action, ref
                )
                return dict(done[1], replayed=True)
        dev = self._device(ref)
        try:
            changed = change(dev)
        except AgentError as exc:
            self._count(action, "refused" if exc.status < 500 else "failed")
            log.warning("%s on GPU %d (%s) refused: %s", action, dev.index, dev.uuid, exc.message)
            raise
        result = {"action": action, "gpu": dev.index, "uuid": dev.uuid, **changed}
        self._count(action, "changed")
        log.info(
            "%s on GPU %d (%s): %s (decision %s)",
            action,
            dev.index,
            dev.uuid,
            changed,
            decision_id or "-",
        )
        if decision_id:
            with self._lock:
                self._done[decision_id] = (what, result)
                while len(self._done) > self.remember:
                    self._done.popitem(last=False)
        return dict(result, replayed=False)

    def _count(self, action: str, result: str) -> None:
        with self._lock:
            self._changes[(action, result)] = self._changes.get((action, result), 0) + 1

    def _devices(self) -> tuple[Device, ...]:
        devices = self.session.devices()
        if devices is None:
            reason = self.session.last_error or "unknown error"
            raise AgentError(503, f"NVML is not available on this node ({reason})")
        return devices

    def _device(self, ref: str) -> Device:
        for dev in self._devices():
            if ref in (dev.uuid, str(dev.index)):
                if dev.handle is None:
                    raise AgentError(410, f"GPU {ref} is lost (fell off the bus?)")
                return dev
        raise AgentError(404, f"no GPU with uuid or index {ref!r} on this node")

    def _clock_range(self, dev: Device) -> tuple[int, int]:
        clocks: set[int] = set()
        for mem in self._nvml(dev, "nvmlDeviceGetSupportedMemoryClocks"):
            clocks.update(self._nvml(dev, "nvmlDeviceGetSupportedGraphicsClocks", mem))
        if not clocks:
            top = self._nvml(dev, "nvmlDeviceGetMaxClockInfo", nvml.CLOCKS["graphics"])
            raise AgentError(409, f"GPU {dev.index} reports no supported clocks (max {top} MHz)")
        return min(clocks), max(clocks)

    def _power_range(self, dev: Device) -> tuple[int, int]:
        low, high = self._nvml(dev, "nvmlDeviceGetPowerManagementLimitConstraints")
        return int(low), int(high)

    def _nvml(self, dev: Device, function: str, *args: Any) -> Any:
        """Call NVML on ``dev``, turning its errors into AgentErrors a client can act on."""
        where = f"GPU {dev.index} ({dev.uuid})"
        try:
            return getattr(self.session.backend, function)(dev.handle, *args)
        except nvml.NoPermission:
            raise AgentError(
                403,
                f"{function} on {where} needs root: NVML answered Insufficient Permissions; "
                "run the exporter as root to use the node agent",
            ) from None
        except nvml.UNSUPPORTED:
            raise AgentError(409, f"{where} does not support {function}") from None
        except nvml.GpuIsLost:
            raise AgentError(410, f"{where} is lost (fell off the bus?)") from None
        except nvml.InvalidArgument:
            raise AgentError(400, f"NVML rejected the arguments of {function} on {where}") from None
        except nvml.DRIVER_LEVEL as exc:
            self.session.invalidate(exc)
            raise AgentError(503, f"NVML failed ({exc}); it will be initialised again") from None
        except nvml.NVMLError as exc:
            raise AgentError(500, f"{function} on {where} failed: {exc}") from None
