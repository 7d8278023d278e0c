"""Fleet files: a fleet described in YAML (pools, projects, classes, job classes, tariff) read
into a ``FleetConfig``, every problem reported as ``file:line: key: what``.

Read by ``gpuops fleet sim --fleet FILE`` (``gpuops.cli.fleet``) and by tests; the shipped
examples are in ``examples/fleets/``. Exporters do not import the engine, so this module has
its own position-aware reading: PyYAML composes the node tree (which carries the line of every
key and item) and ``_Reader`` turns it into plain data plus a path -> line map. The format is
documented in ``docs/fleet-files.md``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuops.sim.fleet.config import (
    GPU_MODELS,
    PROFILES,
    FleetConfig,
    JobSpec,
    PoolSpec,
    ProjectSpec,
    SchedulerSettings,
    sharing_problem,
)
from gpuops.sim.fleet.energy import Tariff, TariffPeriod
from gpuops.sim.fleet.workload import Burst, JobClass, PriorityClass

Path_ = tuple[str | int, ...]
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


class FleetFileError(Exception):
    """The fleet file cannot be used; one line per problem, each naming file, line and key."""


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
    initial_jobs: list[_Job] | None = None
    arrival_rate_per_min: float = Field(default=0.0, ge=0)
    """Background arrivals of the plain model (when there are no job classes)."""


# --- reading YAML with positions ---------------------------------------------------------


class _Reader:
    """Turns a composed YAML node tree into plain data, recording the line of every key."""

    def __init__(self) -> None:
        self.lines: dict[Path_, int] = {}
        self.problems: list[tuple[int, str]] = []
        self._constructor = yaml.SafeLoader("")

    def read(self, node: yaml.Node, path: Path_) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            data: dict[Any, Any] = {}
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key = self._constructor.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if not isinstance(key, str | int | float | bool):
                    self.problems.append((line, "a key must be a plain value"))
                    continue
                if key in seen:
                    self.problems.append(
                        (line, f'duplicate key "{key}" (check lines {seen[key]} and {line})')
                    )
                seen[key] = line
                child = (*path, key if isinstance(key, str | int) else str(key))
                self.lines[child] = line
                data[key] = self.read(value_node, child)
            return data
        if isinstance(node, yaml.SequenceNode):
            return [self.read(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._constructor.construct_object(node)

    def line(self, path: Path_) -> int:
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1


def load_fleet(path: Path) -> FleetConfig:
    """Read and validate a fleet file into a ``FleetConfig`` (listeners at their defaults)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetFileError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_fleet(text, str(path))


def parse_fleet(text: str, source: str = "<fleet>") -> FleetConfig:
    for number, text_line in enumerate(text.splitlines(), start=1):
        if re.match(r"^ *\t", text_line):
            raise FleetFileError(
                f"{source}:{number}: tab character in indentation (YAML indents with spaces)"
            )
    reader = _Reader()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = {} if root is None else reader.read(root, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise FleetFileError(f"{source}:{line}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise FleetFileError(f"{source}:1: YAML syntax error: {exc}") from None
    if reader.problems:
        raise FleetFileError("\n".join(f"{source}:{n}: {m}" for n, m in reader.problems))
    if not isinstance(data, dict):
        raise FleetFileError(f"{source}:1: a fleet file is a mapping (name, pools, ...)")
    try:
        doc = _FleetFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
            where = ".".join(str(p) for p in loc)
            message = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append(f"{source}:{reader.line(loc)}: {where}: {message}")
        raise FleetFileError("\n".join(problems)) from None
    problems = [
        f"{source}:{reader.line(loc)}: {'.'.join(str(p) for p in loc)}: {message}"
        for loc, message in _cross_check(doc)
    ]
    if problems:
        raise FleetFileError("\n".join(problems))
    return _config(doc)


def _duplicates(names: list[str], key: str) -> list[tuple[Path_, str]]:
    seen: dict[str, int] = {}
    out: list[tuple[Path_, str]] = []
    for i, name in enumerate(names):
        if name in seen:
            out.append(((key, i, "name"), f"{name!r} is also {key}[{seen[name]}]"))
        seen.setdefault(name, i)
    return out


def _cross_check(doc: _FleetFile) -> list[tuple[Path_, str]]:
    """Problems between sections: unknown names, quotas beyond a pool, jobs that never fit."""
    out: list[tuple[Path_, str]] = []
    models = ", ".join(GPU_MODELS)
    pools = {p.name: p for p in doc.pools}
    out += _duplicates([p.name for p in doc.pools], "pools")
    out += _duplicates([p.name for p in doc.projects], "projects")
    out += _duplicates([c.name for c in doc.priority_classes], "priority_classes")
    out += _duplicates([c.name for c in doc.job_classes], "job_classes")
    for i, pool in enumerate(doc.pools):
        if pool.model not in GPU_MODELS:
            out.append((("pools", i, "model"), f"{pool.model!r} is unknown; use one of {models}"))
        if pool.sharing is not None:
            problem = sharing_problem(pool.sharing.mode, pool.sharing.slices, pool.model)
            if problem:
                key = "slices" if "slices" in problem.split(" ")[0] else "mode"
                out.append((("pools", i, "sharing", key), problem))
        host = pool.host
        if host is not None and host.peak_watts is not None and host.peak_watts < host.idle_watts:
            out.append(
                (
                    ("pools", i, "host", "peak_watts"),
                    f"{host.peak_watts:g} is below idle_watts {host.idle_watts:g}",
                )
            )
        if pool.max_nodes is not None and pool.max_nodes < pool.nodes:
            out.append(
                (
                    ("pools", i, "max_nodes"),
                    f"max_nodes {pool.max_nodes} is below the {pool.nodes} nodes the pool "
                    "starts with",
                )
            )
    reserved: dict[str, int] = {}
    for i, project in enumerate(doc.projects):
        for pool_name, gpus in project.reserved.items():
            where: Path_ = ("projects", i, "reserved", pool_name)
            if pool_name not in pools:
                out.append((where, f"no pool {pool_name!r}; pools: {', '.join(pools)}"))
            elif gpus < 0:
                out.append((where, f"reserved GPUs must be >= 0, got {gpus}"))
            else:
                reserved[pool_name] = reserved.get(pool_name, 0) + gpus
    for name, total in reserved.items():
        pool = pools[name]
        if not pool.cloud and total > pool.nodes * pool.gpus_per_node:
            out.append(
                (
                    ("projects",),
                    f"projects reserve {total} GPUs of pool {name!r}, which has "
                    f"{pool.nodes * pool.gpus_per_node}",
                )
            )
    for i, pc in enumerate(doc.priority_classes):
        for j, model in enumerate(pc.models):
            if model not in GPU_MODELS:
                out.append(
                    (("priority_classes", i, "models", j), f"{model!r} is unknown; use {models}")
                )
    projects = {p.name for p in doc.projects}
    classes = {c.name for c in doc.priority_classes}
    widest = max(p.gpus_per_node for p in doc.pools)
    for i, jc in enumerate(doc.job_classes):
        if projects and jc.project not in projects:
            out.append((("job_classes", i, "project"), f"no project {jc.project!r}"))
        if jc.priority_class not in classes:
            known = ", ".join(sorted(classes)) or "none declared"
            out.append(
                (
                    ("job_classes", i, "priority_class"),
                    f"{jc.priority_class!r} is not one of {known}",
                )
            )
        too_big = [g for g in jc.gpus if g > widest]
        if too_big:
            out.append(
                (("job_classes", i, "gpus"), f"{too_big} GPUs exceed every node ({widest} GPUs)")
            )
        if jc.memory_gib is not None:
            biggest = max(
                (GPU_MODELS[p.model].memory_bytes for p in doc.pools if p.model in GPU_MODELS),
                default=0,
            )
            if jc.memory_gib * 1024**3 > biggest:
                out.append(
                    (("job_classes", i, "memory_gib"), f"{jc.memory_gib} GiB fits no pool's GPUs")
                )
    out += _initial_job_problems(doc, pools, classes)
    return out


def _initial_job_problems(
    doc: _FleetFile, pools: dict[str, _Pool], classes: set[str]
) -> list[tuple[Path_, str]]:
    """Initial jobs name pools, nodes (node-0, node-1, ... across pools in order) and classes
    that exist, and fit the node they are pinned to."""
    out: list[tuple[Path_, str]] = []
    node_pool: dict[str, _Pool] = {}
    for pool in doc.pools:
        for _ in range(pool.nodes):
            node_pool[f"node-{len(node_pool)}"] = pool
    used: dict[str, int] = {}
    for i, job in enumerate(doc.initial_jobs or []):
        if job.pool and job.pool not in pools:
            out.append((("initial_jobs", i, "pool"), f"no pool {job.pool!r}"))
        if job.priority_class and job.priority_class not in classes:
            out.append((("initial_jobs", i, "priority_class"), f"no class {job.priority_class!r}"))
        if job.node is None:
            continue
        home = node_pool.get(job.node)
        if home is None:
            last = f"node-{len(node_pool) - 1}" if node_pool else "none"
            out.append((("initial_jobs", i, "node"), f"no node {job.node!r} (node-0 .. {last})"))
            continue
        used[job.node] = used.get(job.node, 0) + job.gpus
        if used[job.node] > home.gpus_per_node:
            out.append(
                (
                    ("initial_jobs", i, "gpus"),
                    f"{job.node} has {home.gpus_per_node} GPUs; initial jobs ask for "
                    f"{used[job.node]} there",
                )
            )
    return out


def _host_peak(host: _Host | None) -> float:
    if host is None:
        return 0.0
    return host.idle_watts if host.peak_watts is None else host.peak_watts


def _config(doc: _FleetFile) -> FleetConfig:
    first_pool = doc.pools[0].name
    initial = None
    if doc.initial_jobs is not None:
        initial = tuple(
            JobSpec(
                profile=j.profile,
                gpus=j.gpus,
                project=j.project,
                pool=j.pool or first_pool,
                duration_s=j.duration,
                node=j.node,
                priority_class=j.priority_class,
            )
            for j in doc.initial_jobs
        )
    config = FleetConfig(
        pools=tuple(
            PoolSpec(
                p.name,
                p.nodes,
                p.gpus_per_node,
                p.model,
                p.cloud,
                p.max_nodes,
                p.sharing.mode if p.sharing else None,
                p.sharing.slices if p.sharing else 1,
                p.boot,
                host_idle_watts=p.host.idle_watts if p.host else 0.0,
                host_peak_watts=_host_peak(p.host),
            )
            for p in doc.pools
        ),
        seed=doc.seed,
        name=doc.name,
        start_hour=doc.start_hour,
        arrival_rate_per_min=doc.arrival_rate_per_min if not doc.job_classes else 0.0,
        initial_jobs=initial if initial is not None else (() if doc.job_classes else None),
        reservations=tuple(
            ProjectSpec(p.name, tuple(sorted(p.reserved.items()))) for p in doc.projects
        ),
        priority_classes=tuple(
            PriorityClass(
                c.name,
                c.priority,
                tuple(c.models),
                c.fallback,
                c.preemptible,
                c.preempts,
                c.holdable,
            )
            for c in doc.priority_classes
        ),
        job_classes=tuple(
            JobClass(
                name=c.name,
                project=c.project,
                priority_class=c.priority_class,
                profile=c.profile,
                rate_per_hour=c.rate_per_hour,
                diurnal=tuple(c.diurnal),
                bursts=tuple(Burst(b.hour, b.jobs) for b in c.bursts),
                gpus=tuple(sorted(c.gpus.items())),
                duration_median_s=c.duration.median,
                duration_sigma=c.duration.sigma,
                duration_max_s=c.duration.max,
                memory_gib=c.memory_gib,
                checkpoint_interval_s=c.checkpoint_interval,
                shareable=c.shareable,
            )
            for c in doc.job_classes
        ),
        scheduler=SchedulerSettings(
            doc.scheduler.borrowing,
            doc.scheduler.slice_borrowing,
            doc.scheduler.preemption,
            doc.scheduler.min_runtime,
            doc.scheduler.max_preemptions,
            doc.scheduler.restart,
            doc.scheduler.move_interval,
        ),
        tariff=Tariff(
            doc.tariff.base_price_per_kwh,
            tuple(
                TariffPeriod(p.start_hour, p.end_hour, p.price_per_kwh, p.name)
                for p in doc.tariff.periods
            ),
            doc.tariff.currency,
        ),
    )
    return config


def with_listeners(config: FleetConfig, **listeners: Any) -> FleetConfig:
    """The fleet file's config with the listener settings of the command line."""
    return replace(config, **listeners)
