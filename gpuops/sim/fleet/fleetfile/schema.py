"""The fleet file's schema: one pydantic model per section, each key with its type, bounds and
default, durations written as ``90``, ``"30m"``, ``"2h"`` (``seconds``).

Validated by ``gpuops.sim.fleet.fleetfile.load`` (``_FleetFile.model_validate``), whose
messages name the file, line and key; checked across sections by
``gpuops.sim.fleet.fleetfile.checks`` and turned into a ``FleetConfig`` by
``gpuops.sim.fleet.fleetfile.build``. The format is documented in ``docs/fleet-files.md``.
The models keep their underscored names: pydantic names them in its messages ("instance of
_Pool").
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuops.sim.fleet.config import PROFILES

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def seconds(value: Any) -> Any:
    """``90``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1.5d"`` -> seconds; anything else as given
    (pydantic then says what is wrong)."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a duration (a number of seconds or e.g. 30m, 2h)")
        return float(match.group(1)) * _UNITS[match.group(2)]
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sharing(_Model):
    mode: str
    """mig | time-slicing"""
    slices: int = Field(ge=2)


class _Host(_Model):
    idle_watts: float = Field(ge=0, le=100_000)
    """What the node's host (all but its GPUs) draws at no load, whenever the node is on."""
    peak_watts: float | None = Field(default=None, ge=0, le=100_000)
    """Its draw with its GPUs at full load; None: a constant ``idle_watts``."""


class _Pool(_Model):
    name: str = Field(min_length=1)
    model: str
    nodes: int = Field(ge=0)
    gpus_per_node: int = Field(default=4, ge=1, le=16)
    cloud: bool = False
    max_nodes: int | None = Field(default=None, ge=0)
    """Most nodes scale_out may bring the pool to (None: no limit)."""
    sharing: _Sharing | None = None
    boot: float = Field(default=0.0, ge=0)
    """How long a machine powered up takes before it runs jobs."""
    host: _Host | None = None
    """The power of each node's host (``PoolSpec.host_idle_watts``); None: not modelled."""
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    """A powered GPU-hour's price besides energy (``PoolSpec.price_per_gpu_hour``)."""

    _s = field_validator("boot", mode="before")(seconds)


class _Project(_Model):
    name: str = Field(min_length=1)
    reserved: dict[str, int] = {}
    """pool -> GPUs reserved for the project."""


class _PriorityClass(_Model):
    name: str = Field(min_length=1)
    priority: int
    models: list[str] = []
    fallback: bool = True
    preemptible: bool = True
    preempts: bool = False
    holdable: bool = False


class _Duration(_Model):
    median: float = Field(gt=0)
    sigma: float = Field(default=1.0, ge=0)
    max: float = Field(default=7 * 86400.0, gt=0)

    _s = field_validator("median", "max", mode="before")(seconds)


class _Burst(_Model):
    hour: float = Field(ge=0, lt=24)
    jobs: int = Field(ge=1, le=10_000)


class _JobClass(_Model):
    name: str = Field(min_length=1)
    project: str
    priority_class: str
    profile: str = "training"
    rate_per_hour: float = Field(ge=0)
    diurnal: list[float] = []
    bursts: list[_Burst] = []
    gpus: dict[int, float] = {1: 1.0}
    duration: _Duration
    memory_gib: float | None = Field(default=None, gt=0)
    checkpoint_interval: float | None = Field(default=None, gt=0)
    shareable: bool = False
    """Its jobs may run on slices of shared GPUs (pools with ``sharing``)."""
    slowdown_objective: float | None = Field(default=None, ge=1)
    """A session's answers at most this many times slower than alone (``JobClass``)."""

    _s = field_validator("checkpoint_interval", mode="before")(seconds)

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"{value!r} is not a profile; use one of {', '.join(PROFILES)}")
        return value

    @field_validator("diurnal")
    @classmethod
    def _diurnal(cls, value: list[float]) -> list[float]:
        if value and (len(value) != 24 or min(value) < 0 or sum(value) <= 0):
            raise ValueError(
                f"needs 24 weights >= 0 (one per hour, not all 0), got {len(value)} values"
            )
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: dict[int, float]) -> dict[int, float]:
        if not value or any(g < 1 for g in value) or any(w < 0 for w in value.values()):
            raise ValueError("maps GPU counts >= 1 to weights >= 0, e.g. {1: 0.7, 4: 0.3}")
        if sum(value.values()) <= 0:
            raise ValueError("at least one weight must be > 0")
        return value


class _Period(_Model):
    name: str = "peak"
    start_hour: float = Field(ge=0, le=24)
    end_hour: float = Field(ge=0, le=24)
    price_per_kwh: float = Field(ge=0)


class _Tariff(_Model):
    currency: str = "USD"
    base_price_per_kwh: float = Field(default=0.12, ge=0)
    periods: list[_Period] = []


class _Scheduler(_Model):
    borrowing: bool = True
    slice_borrowing: bool = False
    preemption: bool = True
    min_runtime: float = Field(default=600.0, ge=0)
    max_preemptions: int = Field(default=3, ge=0)
    restart: float = Field(default=300.0, ge=0)
    """What a job stopped and started again pays on top of its work since a checkpoint."""
    move_interval: float = Field(default=3600.0, ge=0)
    """A job that consolidation moved is not moved again for this long."""

    _s = field_validator("min_runtime", "restart", "move_interval", mode="before")(seconds)


class _HarmLimits(_Model):
    jct_increase: float = Field(default=0.10, ge=0, le=100)
    """A class's mean completion time at most this share longer (``HarmLimits``)."""
    over_objective: float = Field(default=0.05, ge=0, le=1)
    non_preemptible_stops: int = Field(default=0, ge=0)
    completed_decrease: float = Field(default=0.10, ge=0, le=1)
    """A class's completed jobs at most this share fewer (``HarmLimits``)."""


class _Job(_Model):
    profile: str = "training"
    gpus: int = Field(default=1, ge=1)
    project: str = "default"
    pool: str = ""
    node: str | None = None
    duration: float | None = Field(default=None, gt=0)
    priority_class: str = ""

    _s = field_validator("duration", mode="before")(seconds)


class _FleetFile(_Model):
    name: str = "fleet"
    description: str = ""
    calibration: str = ""
    """How the workload's figures were chosen and from which sources (free text)."""
    seed: int = 42
    start_hour: float = Field(default=0.0, ge=0, lt=24)
    pools: list[_Pool] = Field(min_length=1)
    projects: list[_Project] = []
    priority_classes: list[_PriorityClass] = []
    job_classes: list[_JobClass] = []
    scheduler: _Scheduler = _Scheduler()
    tariff: _Tariff = _Tariff()
    harm_limits: _HarmLimits = _HarmLimits()
    """What a policy may cost before ``gpuops whatif`` flags it."""
    initial_jobs: list[_Job] | None = None
    arrival_rate_per_min: float = Field(default=0.0, ge=0)
    """Background arrivals of the plain model (when there are no job classes)."""
