"""Prometheus collectors of the simulated fleet: one per node (``nvml_*`` series, as the real
NVML exporter names them, plus ``node`` and ``pool``) and one for the fleet (``gpuops_*``).

Registered by ``gpuops.sim.fleet.sim`` in a private ``CollectorRegistry`` per listener (never the
global one). Each ``collect`` reads one copy from ``gpuops.sim.fleet.cluster``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.model import FleetReading, GpuReading

_GPU = ["gpu", "uuid", "node", "pool"]
_MHZ = 1_000_000


def _gpu_labels(r: GpuReading) -> list[str]:
    return [str(r.index), r.uuid, r.node, r.pool]


GPU_SERIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    # (name, type, help, labels after gpu, uuid, node, pool)
    ("nvml_gpu_up", "gauge", "1 when the GPU answers NVML queries.", ()),
    (
        "nvml_gpu_info",
        "gauge",
        "Identity of the GPU; always 1.",
        ("name", "model", "driver_version", "pci_bus_id"),
    ),
    ("nvml_gpu_utilization_ratio", "gauge", "GPU busy time share, 0-1.", ()),
    ("nvml_gpu_memory_utilization_ratio", "gauge", "Memory used share, 0-1.", ()),
    ("nvml_gpu_memory_total_bytes", "gauge", "Total GPU memory.", ()),
    ("nvml_gpu_memory_used_bytes", "gauge", "Used GPU memory.", ()),
    ("nvml_gpu_memory_free_bytes", "gauge", "Free GPU memory.", ()),
    ("nvml_gpu_power_usage_watts", "gauge", "Power draw.", ()),
    ("nvml_gpu_power_limit_watts", "gauge", "Enforced power limit.", ()),
    ("nvml_gpu_temperature_celsius", "gauge", "GPU core temperature.", ()),
    ("nvml_gpu_clock_hertz", "gauge", "Current clock frequency.", ("clock",)),
    ("nvml_gpu_clock_max_hertz", "gauge", "Maximum supported clock frequency.", ("clock",)),
    ("nvml_gpu_energy_joules", "counter", "Energy consumed since the driver loaded.", ()),
)
"""The ``nvml_*`` series of a GPU, as the real NVML exporter names them."""


_CLOCKS = ("graphics", "sm", "memory")


def gpu_series(r: GpuReading, driver_version: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(series name, values of its labels after the GPU's) of each of one GPU's samples, in
    the order of ``gpu_values``: the same for every reading of that GPU, so a writer can
    build each series' labels once (``gpuops.sim.fleet.virtual``). A counter's name is
    without ``_total``."""
    series: list[tuple[str, tuple[str, ...]]] = [
        ("nvml_gpu_up", ()),
        ("nvml_gpu_info", (r.name, r.model, driver_version, r.pci_bus_id)),
    ]
    series += [
        (name, ())
        for name in (
            "nvml_gpu_utilization_ratio",
            "nvml_gpu_memory_utilization_ratio",
            "nvml_gpu_memory_total_bytes",
            "nvml_gpu_memory_used_bytes",
            "nvml_gpu_memory_free_bytes",
            "nvml_gpu_power_usage_watts",
            "nvml_gpu_power_limit_watts",
            "nvml_gpu_temperature_celsius",
        )
    ]
    for clock in _CLOCKS:
        series += [("nvml_gpu_clock_hertz", (clock,)), ("nvml_gpu_clock_max_hertz", (clock,))]
    series.append(("nvml_gpu_energy_joules", ()))
    return tuple(series)


def gpu_values(r: GpuReading) -> tuple[float, ...]:
    """The values of one GPU's reading, in the order of ``gpu_series``."""
    graphics = r.graphics_clock_mhz * _MHZ
    top = r.max_graphics_clock_mhz * _MHZ
    total = r.memory_total_bytes
    used = r.memory_used_bytes
    return (
        1.0,
        1.0,
        r.utilization,
        used / total,
        float(total),
        float(used),
        float(total - used),
        r.power_watts,
        r.power_limit_watts,
        r.temperature_celsius,
        float(graphics),
        float(top),
        float(graphics),
        float(top),
        float(r.memory_clock_mhz * _MHZ),
        float(r.max_memory_clock_mhz * _MHZ),
        r.energy_joules,
    )


def gpu_samples(r: GpuReading, driver_version: str) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """(series name, values of its labels after the GPU's, value) of one GPU's reading; a
    counter's name is without ``_total``. Served by ``NodeCollector``."""
    for (name, extra), value in zip(gpu_series(r, driver_version), gpu_values(r), strict=True):
        yield name, extra, value


class NodeCollector(Collector):
    """The ``nvml_*`` series of every GPU of one node."""

    def __init__(self, cluster: Cluster, node: str, driver_version: str) -> None:
        """``driver_version``: what a node no longer in the cluster reports."""
        self.cluster = cluster
        self.node = node
        self.driver_version = driver_version

    def describe(self) -> Iterator[Metric]:
        return iter(self._families([]))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self.cluster.gpu_readings(self.node)))

    def _families(self, readings: list[GpuReading]) -> list[Metric]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for name, kind, text, extra in GPU_SERIES:
            family_type = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            families[name] = family_type(name, text, labels=[*_GPU, *extra])
        with self.cluster.lock:
            node = self.cluster.nodes.get(self.node)
            driver = node.driver_version if node is not None else self.driver_version
        for r in readings:
            labels = _gpu_labels(r)
            for name, extra_values, value in gpu_samples(r, driver):
                families[name].add_metric([*labels, *extra_values], value)
        return list(families.values())


class FleetCollector(Collector):
    """The ``gpuops_*`` fleet series the policies need: allocation, queue, nodes, jobs."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        r = self.cluster.fleet_reading()
        allocated = GaugeMetricFamily(
            "gpuops_gpu_allocated",
            "1 when a job holds the GPU; free GPUs are 0 with empty job and project.",
            labels=["node", "uuid", "job", "project"],
        )
        for node, uuid, job, project in r.allocations:
            allocated.add_metric([node, uuid, job, project], 1.0 if job else 0.0)
        yield allocated
        queue = GaugeMetricFamily(
            "gpuops_queue_pending_jobs",
            "Jobs waiting, by Slurm's reason names: Resources (for GPUs), JobHeldAdmin (their "
            "priority class is held until off-peak).",
            labels=["pool", "reason"],
        )
        for pool, n in sorted(r.queue.items()):
            held = r.held_queue.get(pool, 0)
            queue.add_metric([pool, "Resources"], n - held)
            queue.add_metric([pool, "JobHeldAdmin"], held)
        yield queue
        nodes = GaugeMetricFamily(
            "gpuops_fleet_nodes",
            "Nodes by pool and state (up|failed|drained|booting).",
            labels=["pool", "state"],
        )
        for (pool, state), n in sorted(r.nodes.items()):
            nodes.add_metric([pool, state], n)
        yield nodes
        limits = GaugeMetricFamily(
            "gpuops_fleet_pool_max_nodes",
            "Most nodes scale_out may bring the pool to (only pools with a limit).",
            labels=["pool"],
        )
        for pool, spec in sorted(self.cluster.pools.items()):
            if spec.max_nodes is not None:
                limits.add_metric([pool], spec.max_nodes)
        yield limits
        demand = GaugeMetricFamily(
            "gpuops_queue_scale_demand_jobs",
            "Queued jobs that one more node of the pool could place (pools with machines left "
            "to power up, the job's project admitted there; not those a booting node will "
            "take; in a fallback pool, not of the class's models, only jobs that waited its "
            "boot time).",
            labels=["pool"],
        )
        for pool, n in sorted(r.demand.items()):
            demand.add_metric([pool], n)
        yield demand
        yield from _sharing_families(r)
        running = GaugeMetricFamily("gpuops_jobs_running", "Running jobs.", labels=["pool"])
        for pool, n in sorted(r.running.items()):
            running.add_metric([pool], n)
        yield running
        yield CounterMetricFamily(
            "gpuops_jobs_migrated",
            "Jobs migrate moved to another node (not those it requeued).",
            value=r.migrated,
        )
        yield CounterMetricFamily(
            "gpuops_gpus_reclaimed", "GPUs' jobs ended by reclaim.", value=r.reclaimed
        )
        yield from _energy_families(r)


def _sharing_families(r: FleetReading) -> Iterator[Metric]:
    """GPU sharing and lending: jobs per shared GPU, the queue only borrowing could place,
    pools that lend (``gpuops.sim.fleet.scheduler``)."""
    sharing = GaugeMetricFamily(
        "gpuops_gpu_shared_jobs",
        "Jobs on the slices of a GPU of a pool that can share (0: not shared; 0 also for a "
        "GPU of a pool that cannot share held whole by a shareable job another of whose pools "
        "can, while a shared GPU there has a free slice for it, its project admitted, and it "
        "was not moved within move_interval: pack moves it there); "
        "absent for a GPU held whole by a job that is not "
        "shareable, too big for one of its slices, or on borrowed capacity where the fleet "
        "does not lend slices (scheduler.slice_borrowing).",
        labels=["node", "uuid"],
    )
    for node, uuid, n in r.sharing:
        sharing.add_metric([node, uuid], n)
    yield sharing
    borrow = GaugeMetricFamily(
        "gpuops_queue_borrow_demand_jobs",
        "Queued jobs that only idle GPUs reserved by other projects in the pool could place.",
        labels=["pool"],
    )
    for pool, n in sorted(r.borrow_demand.items()):
        borrow.add_metric([pool], n)
    yield borrow
    lending = GaugeMetricFamily(
        "gpuops_pool_lending",
        "1 while the pool lends its idle reserved GPUs to other projects (lend).",
        labels=["pool"],
    )
    for pool, on in sorted(r.lending.items()):
        lending.add_metric([pool], 1.0 if on else 0.0)
    yield lending
    drainable = GaugeMetricFamily(
        "gpuops_node_drainable",
        "1 when every job on the (at most half used) node can move to other nodes of its pool "
        "now, so consolidate would empty it and power it down (Scheduler.drain_plan).",
        labels=["node", "pool"],
    )
    for node, pool, ok in r.drainable:
        drainable.add_metric([node, pool], ok)
    yield drainable
    borrowed = GaugeMetricFamily(
        "gpuops_gpu_borrowed",
        "1 for a GPU a job on borrowed capacity holds or shares (another project's reserved "
        "GPUs, lent, or their free slices with scheduler.slice_borrowing); absent for every "
        "other GPU. The owner reclaims them by preemption.",
        labels=["node", "uuid"],
    )
    for node, uuid in r.borrowed:
        borrowed.add_metric([node, uuid], 1.0)
    yield borrowed
    booting = GaugeMetricFamily(
        "gpuops_node_booting",
        "1 while the node boots after a power-up (it draws power, runs no job), else 0: a "
        "power-down policy counts idle time from when the node is ready.",
        labels=["node", "pool"],
    )
    for node, pool, boots in r.booting:
        booting.add_metric([node, pool], boots)
    yield booting
    powered_down = GaugeMetricFamily(
        "gpuops_node_powered_down",
        "1 for a node powered down (scale_in, consolidate) in the last hour: switched off, "
        "not failed; its exporter is gone with it.",
        labels=["node", "pool"],
    )
    for node, pool in r.powered_down:
        powered_down.add_metric([node, pool], 1.0)
    yield powered_down


_ONE_LABEL: tuple[tuple[str, str, str, str, str], ...] = (
    # (kind, name, help, label, FleetReading field)
    (
        "gauge",
        "gpuops_fleet_power_watts",
        "Power drawn by the nodes: GPUs and hosts.",
        "pool",
        "power_watts",
    ),
    (
        "counter",
        "gpuops_fleet_energy_joules",
        "Energy drawn by the GPUs since start.",
        "pool",
        "energy_joules",
    ),
    (
        "gauge",
        "gpuops_queue_pending_class_jobs",
        "Queued jobs by priority class.",
        "priority_class",
        "class_queue",
    ),
    (
        "gauge",
        "gpuops_priority_class_held",
        "1 while queued jobs of a holdable class are held (hold_class).",
        "priority_class",
        "held",
    ),
    (
        "counter",
        "gpuops_jobs_completed",
        "Jobs finished, by priority class.",
        "priority_class",
        "completed",
    ),
    (
        "gauge",
        "gpuops_project_gpus_allocated",
        "GPUs held by a project's jobs.",
        "project",
        "project_gpus",
    ),
    (
        "counter",
        "gpuops_jobs_preempted",
        "Preemptions of a project's jobs.",
        "project",
        "preemptions",
    ),
    (
        "counter",
        "gpuops_preemption_credit_gpu_seconds",
        "GPU-seconds of work preempted jobs lost, credited to their project.",
        "project",
        "credit_gpu_s",
    ),
)
"""Fleet series with one label: power and energy per pool (``gpuops.sim.fleet.energy``),
queue, holds and completions per priority class, allocation and preemptions per project
(``gpuops.sim.fleet.scheduler``)."""


def _energy_families(r: FleetReading) -> Iterator[Metric]:
    """The one-label series above, the electricity price and the energy's cost."""
    for kind, name, text, label, attr in _ONE_LABEL:
        family_type = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
        family = family_type(name, text, labels=[label])
        values: dict[str, float] = getattr(r, attr)
        for key, value in sorted(values.items()):
            family.add_metric([key], float(value))
        yield family
    cost = CounterMetricFamily(
        "gpuops_fleet_energy_cost",
        "What that energy cost at the price when it was drawn (currency units).",
        labels=["currency"],
    )
    cost.add_metric([r.currency], r.energy_cost)
    yield cost
    price = GaugeMetricFamily(
        "gpuops_electricity_price_per_kwh",
        "Electricity price now (the tariff's period).",
        labels=["currency", "period"],
    )
    price.add_metric([r.currency, r.period], r.price_per_kwh)
    yield price
    off_peak = GaugeMetricFamily(
        "gpuops_electricity_off_peak_price_per_kwh",
        "The tariff's lowest price (its valley).",
        labels=["currency"],
    )
    off_peak.add_metric([r.currency], r.off_peak_price_per_kwh)
    yield off_peak
    yield CounterMetricFamily(
        "gpuops_fleet_work_gpu_seconds",
        "Job progress in GPU-seconds at full clock (less than GPU time under clock locks).",
        value=r.work_gpu_s,
    )
    quota = GaugeMetricFamily(
        "gpuops_project_quota_gpus",
        "GPUs guaranteed to a project in a pool (reserved plus granted).",
        labels=["project", "pool"],
    )
    for (project, pool), gpus in sorted(r.quotas.items()):
        quota.add_metric([project, pool], gpus)
    yield quota
