"""The fleet in virtual time: a ``Cluster`` stepped by a clock the caller owns, its series
"scraped" at each scrape instant and written into Prometheus with those instants as
timestamps — the fleet side of ``gpuops whatif`` (docs/whatif.md).

No thread, no listener, no file_sd: ``VirtualFleet.run_until(t)`` advances the cluster to
virtual second ``t``, collecting what ``exporters.fleet.collectors`` would serve at every
scrape on the way (with the labels a scrape of ``exporters.fleet.sd``'s jobs adds: ``job``,
``instance``, ``node``/``pool`` of node targets, and ``up``), and hands them to a
``RemoteWriter``. The engine side evaluates its policies at the same virtual instants and
acts on ``cluster`` through ``exporters.fleet.operations``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from exporters.fleet.cluster import Cluster
from exporters.fleet.collectors import GPU_SERIES, FleetCollector, gpu_samples
from exporters.fleet.config import FleetConfig
from exporters.fleet.control import Idempotency, control_handler
from exporters.fleet.listener import Listener
from exporters.fleet.model import GpuReading
from exporters.fleet.remotewrite import Labels, RemoteWriter
from exporters.fleet.report import Recorder
from exporters.fleet.sd import FLEET_JOB, NODES_JOB


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
    ) -> None:
        self.cluster = Cluster(config)
        self.recorder = recorder
        """Observes the cluster at every scrape (``exporters.fleet.report``)."""
        self.start_ms = start_ms
        self.writer = writer
        self.scrape_interval_s = scrape_interval_s
        self.step_s = step_s or scrape_interval_s
        """Simulated seconds per cluster step (at most one scrape interval)."""
        self.flush_every = flush_every
        """Scrapes buffered per remote-write request."""
        self._fleet = FleetCollector(self.cluster)
        self._driver = config.driver_version
        self._next_scrape = 0.0
        self._buffered = 0
        self._control: Listener | None = None
        self.scrapes = 0
        self.last: dict[Labels, float] = {}
        self._keys: dict[tuple[object, ...], Labels] = {}
        """(name, target, label values) -> sorted labels: sorting once per series, not per
        sample, is most of a scrape's cost at 500 GPUs."""

    def serve_control(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve the fleet's control API (``exporters.fleet.control``) for this cluster, so
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
        while self._next_scrape <= t:
            while self.cluster.time < self._next_scrape:
                self.cluster.advance(min(self.step_s, self._next_scrape - self.cluster.time))
            self.scrape()
            self._next_scrape += self.scrape_interval_s
        while self.cluster.time < t:
            self.cluster.advance(min(self.step_s, t - self.cluster.time))
        self.flush()

    def scrape(self) -> None:
        if self.recorder is not None:
            self.recorder.observe(self.cluster)
        if self.writer is None and self.recorder is not None:
            self.scrapes += 1
            return  # nothing to write: no need to collect the series
        samples = dict(self._samples())
        self.last = samples
        self.scrapes += 1
        if self.writer is not None:
            self.writer.add(self.timestamp_ms(self.cluster.time), samples)
            self._buffered += 1
            if self._buffered >= self.flush_every:
                self.flush()

    def flush(self) -> None:
        if self.writer is not None and self._buffered:
            self.writer.flush()
        self._buffered = 0

    def _samples(self) -> Iterator[tuple[Labels, float]]:
        with self.cluster.lock:
            nodes = [(n.name, n.pool, n.failed) for n in self.cluster.nodes.values()]
        for name, pool, failed in nodes:
            target = (("instance", name), ("job", NODES_JOB), ("node", name), ("pool", pool))
            yield (("__name__", "up"), *target), 0.0 if failed else 1.0
            if failed:
                continue
            yield from self._gpu_samples(name, target)
        fleet = (("instance", "fleet"), ("job", FLEET_JOB))
        yield (("__name__", "up"), *fleet), 1.0
        yield from self._flatten(self._fleet.collect(), fleet)

    def _gpu_samples(self, node: str, target: Labels) -> Iterator[tuple[Labels, float]]:
        keys = self._keys
        for r in self.cluster.gpu_readings(node):
            for name, extra, value in gpu_samples(r, self._driver):
                cache_key = (name, r.uuid, *extra)
                labels = keys.get(cache_key)
                if labels is None:
                    labels = keys[cache_key] = _gpu_key(name, r, extra, target)
                yield labels, float(value)

    def _flatten(
        self, families: Iterator[Metric], target: Labels
    ) -> Iterator[tuple[Labels, float]]:
        """Samples with the target's labels added under the series' own (``honor_labels``)."""
        keys = self._keys
        for family in families:
            for sample in family.samples:
                cache_key = (sample.name, target, *sample.labels.values())
                labels = keys.get(cache_key)
                if labels is None:
                    merged = {**dict(target), **sample.labels, "__name__": sample.name}
                    labels = keys[cache_key] = tuple(sorted(merged.items()))
                yield labels, float(sample.value)


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
