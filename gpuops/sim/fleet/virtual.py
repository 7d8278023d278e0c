"""The fleet in virtual time: a ``Cluster`` stepped by a clock the caller owns, its series
"scraped" at each scrape instant and written into Prometheus with those instants as
timestamps — the fleet side of ``gpuops whatif`` (docs/whatif.md).

No thread, no listener, no file_sd: ``VirtualFleet.run_until(t)`` advances the cluster to
virtual second ``t``, collecting what ``gpuops.sim.fleet.collectors`` would serve at every
scrape on the way (with the labels a scrape of ``gpuops.sim.fleet.sd``'s jobs adds: ``job``,
``instance``, ``node``/``pool`` of node targets, and ``up``), and hands them to a
``RemoteWriter``. The engine side evaluates its policies at the same virtual instants and
acts on ``cluster`` through ``gpuops.sim.fleet.operations``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from prometheus_client import CollectorRegistry

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.collectors import GPU_SERIES, FleetCollector, gpu_series, gpu_values
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.control import Idempotency, control_handler
from gpuops.sim.fleet.listener import Listener
from gpuops.sim.fleet.model import GpuReading
from gpuops.sim.fleet.remotewrite import Labels, RemoteWriter, SeriesTable
from gpuops.sim.fleet.report import Recorder
from gpuops.sim.fleet.rollout import Rollout, RolloutSpec
from gpuops.sim.fleet.sd import FLEET_JOB, NODES_JOB


class Meter:
    """Wall and CPU seconds (of the measuring thread) spent in one part of a run."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def add(self, wall_s: float, cpu_s: float) -> None:
        self.wall_s += wall_s
        self.cpu_s += cpu_s

    def pair(self) -> tuple[float, float]:
        return self.wall_s, self.cpu_s

    @contextmanager
    def __call__(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(time.perf_counter() - wall, time.thread_time() - cpu)


class Stepped(Protocol):
    """Something moved on after each cluster step (the what-if's fault injection)."""

    def step(self, cluster: Cluster) -> None: ...


class VirtualFleet:
    """A cluster on a virtual clock whose scrapes go to ``writer`` (None: kept in ``last``)."""

    def __init__(
        self,
        config: FleetConfig,
        start_ms: int,
        writer: RemoteWriter | None = None,
        scrape_interval_s: float = 15.0,
        step_s: float | None = None,
        flush_every: int = 20,
        recorder: Recorder | None = None,
        record_interval_s: float | None = None,
        names: frozenset[str] | None = None,
        rollout: RolloutSpec | None = None,
    ) -> None:
        self.cluster = Cluster(config)
        self.rollout = None if rollout is None else Rollout(rollout, self.cluster)
        """A batch operation rolled over the cluster, moved on after each cluster step."""
        if self.rollout is not None:
            self.rollout.step(self.cluster)  # one that starts at once starts now
        self.stepped: list[Stepped] = []
        """Moved on after each cluster step, after the rollout (``gpuops.sim.reliability``)."""
        self.names = names
        """The series names written (None: every series): a what-if writes only what its
        rules read (``gpuops.sim.whatif.queries.metric_names``), Prometheus' ingest being its
        largest cost."""
        self.recorder = recorder
        """Observes the cluster every ``record_interval_s`` (``gpuops.sim.fleet.report``)."""
        self.record_interval_s = record_interval_s or scrape_interval_s
        """Virtual seconds between two observations of the recorder (default: at every
        scrape): what a run measures need not depend on how often its series are written."""
        self.start_ms = start_ms
        self.writer = writer
        self.scrape_interval_s = scrape_interval_s
        self.step_s = step_s or scrape_interval_s
        """Simulated seconds per cluster step (at most one scrape interval)."""
        self.flush_every = flush_every
        """Scrapes buffered per remote-write request."""
        self._fleet = FleetCollector(self.cluster)
        self._scrape_n = 0
        self._record_n = 0
        self._buffered = 0
        self._control: Listener | None = None
        self.scrapes = 0
        self.series = writer.series if writer is not None else SeriesTable()
        self._last: tuple[list[int], list[float]] = ([], [])
        self._keys: dict[tuple[object, ...], int] = {}
        """(name, label values) of a fleet target's sample (a target: of its ``up``) -> its
        series number."""
        self._gpu_series: dict[tuple[object, ...], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        """A GPU's identity and target -> its written series' numbers, and their places in
        ``gpu_values`` (every place: all of them)."""
        self.step_time = Meter()
        """Stepping the cluster."""
        self.record_time = Meter()
        """The recorder's observations."""
        self.collect_time = Meter()
        """Collecting the scrapes' samples."""

    def serve_control(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve the fleet's control API (``gpuops.sim.fleet.control``) for this cluster, so
        the engine's ``fleet`` executor acts on it unchanged; returns its base URL. Calls are
        applied at once, at the virtual time the cluster is at (the engine's cycle at virtual
        time t runs while the clock waits)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._fleet)
        self._control = Listener(
            host, port, control_handler(self.cluster, registry, Idempotency()), "control"
        )
        self._control.open()
        return f"http://{host}:{self._control.port}"

    def close(self) -> None:
        """Close the control API, if served."""
        if self._control is not None:
            self._control.close()
            self._control = None

    def __enter__(self) -> VirtualFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def now(self) -> float:
        """Virtual seconds since start."""
        return self.cluster.time

    def timestamp_ms(self, t: float) -> int:
        return self.start_ms + int(round(t * 1000))

    def run_until(self, t: float) -> None:
        """Advance to virtual second ``t``, scraping at every scrape instant up to it, and
        flush so that Prometheus has every sample up to ``t`` before this returns."""
        while True:
            next_scrape = self._scrape_n * self.scrape_interval_s
            next_record = self._record_n * self.record_interval_s
            if self.recorder is None or self.record_interval_s == self.scrape_interval_s:
                next_record = math.inf  # observed with each scrape
            at = min(next_scrape, next_record)
            if at > t:
                break
            with self.step_time():
                while self.cluster.time < at:
                    self._advance(min(self.step_s, at - self.cluster.time))
            if at == next_record:
                self._observe()
                self._record_n += 1
            if at == next_scrape:
                self.scrape(observe=next_record == math.inf)
                self._scrape_n += 1
        with self.step_time():
            while self.cluster.time < t:
                self._advance(min(self.step_s, t - self.cluster.time))
        self.flush()

    def _advance(self, dt: float) -> None:
        self.cluster.advance(dt)
        if self.rollout is not None:
            self.rollout.step(self.cluster)
        for stepped in self.stepped:
            stepped.step(self.cluster)

    def _observe(self) -> None:
        if self.recorder is not None:
            with self.record_time():
                self.recorder.observe(self.cluster)

    def scrape(self, observe: bool = True) -> None:
        """Collect every series now and hand them to the writer (with ``observe``: the
        recorder observes first)."""
        if observe:
            self._observe()
        if self.writer is None and self.recorder is not None:
            self.scrapes += 1
            return  # nothing to write: no need to collect the series
        with self.collect_time():
            ids, values = self._samples()
        self._last = (ids, values)
        self.scrapes += 1
        if self.writer is not None:
            self.writer.add_ids(self.timestamp_ms(self.cluster.time), ids, values)
            self._buffered += 1
            if self._buffered >= self.flush_every:
                self.flush()

    @property
    def last(self) -> dict[Labels, float]:
        """The series of the last scrape and their values."""
        ids, values = self._last
        return {self.series.labels[i]: v for i, v in zip(ids, values, strict=True)}

    def flush(self) -> None:
        if self.writer is not None and self._buffered:
            self.writer.flush()
        self._buffered = 0

    def _samples(self) -> tuple[list[int], list[float]]:
        """One scrape (series numbers and values): every series of every node target, then
        the fleet target's."""
        ids: list[int] = []
        values: list[float] = []
        with self.cluster.lock:
            nodes = [
                (n.name, n.pool, n.failed, n.driver_version) for n in self.cluster.nodes.values()
            ]
        names = self.names
        node_up = names is None or "up" in names
        for name, pool, failed, driver in nodes:
            target = (("instance", name), ("job", NODES_JOB), ("node", name), ("pool", pool))
            if node_up:
                ids.append(self._id(target, (("__name__", "up"), *target)))
                values.append(0.0 if failed else 1.0)
            if failed:
                continue
            for r in self.cluster.gpu_readings(name):
                gpu_ids, places = self._gpu_ids(r, target, driver)
                ids += gpu_ids
                if places is _ALL:
                    values += gpu_values(r)
                elif places:
                    read = gpu_values(r)
                    values += [read[i] for i in places]
        fleet = (("instance", "fleet"), ("job", FLEET_JOB))
        if node_up:
            ids.append(self._id(fleet, (("__name__", "up"), *fleet)))
            values.append(1.0)
        keys = self._keys
        for family in self._fleet.collect():
            for sample in family.samples:
                cache_key = (sample.name, *sample.labels.values())
                series = keys.get(cache_key)
                if series is None:  # the target's labels under the series' own (honor_labels)
                    if names is not None and sample.name not in names:
                        series = keys[cache_key] = -1  # not written
                    else:
                        merged = {**dict(fleet), **sample.labels, "__name__": sample.name}
                        series = keys[cache_key] = self.series.id(tuple(sorted(merged.items())))
                if series >= 0:
                    ids.append(series)
                    values.append(float(sample.value))
        return ids, values

    def _id(self, cache_key: tuple[object, ...], labels: Labels) -> int:
        found = self._keys.get(cache_key)
        if found is None:
            found = self._keys[cache_key] = self.series.id(labels)
        return found

    def _gpu_ids(
        self, r: GpuReading, target: Labels, driver: str
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The series numbers of a GPU's written samples and their places in ``gpu_values``
        (``_ALL``: every sample, in ``gpu_series`` order), built once per GPU identity, its
        driver version and target."""
        identity = (r.uuid, r.index, r.name, r.model, r.pci_bus_id, driver, target)
        found = self._gpu_series.get(identity)
        if found is None:
            keys = [_gpu_key(name, r, extra, target) for name, extra in gpu_series(r, driver)]
            places = tuple(
                i for i, key in enumerate(keys) if self.names is None or _name(key) in self.names
            )
            ids = tuple(self.series.id(keys[i]) for i in places)
            found = self._gpu_series[identity] = (
                ids,
                _ALL if len(places) == len(keys) else places,
            )
        return found


_ALL: tuple[int, ...] = (-1,)
"""``VirtualFleet._gpu_ids``' places when every sample of a GPU is written."""


def _name(labels: Labels) -> str:
    return dict(labels)["__name__"]


_EXTRA = {name: extra for name, _kind, _text, extra in GPU_SERIES}
_COUNTERS = {name for name, kind, _text, _extra in GPU_SERIES if kind == "counter"}


def _gpu_key(name: str, r: GpuReading, extra: tuple[str, ...], target: Labels) -> Labels:
    labels = {
        **dict(target),
        "gpu": str(r.index),
        "uuid": r.uuid,
        "node": r.node,
        "pool": r.pool,
        **dict(zip(_EXTRA[name], extra, strict=True)),
        "__name__": name + "_total" if name in _COUNTERS else name,
    }
    return tuple(sorted(labels.items()))
