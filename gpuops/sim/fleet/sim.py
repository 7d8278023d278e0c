"""``FleetSim``: the simulated fleet running in this process — cluster, clock thread, one
/metrics listener per node, the control listener and the file_sd file.

Started by ``gpuops fleet sim`` (``gpuops.cli.fleet``), by ``gpuops demo`` and by tests::

    with FleetSim(FleetConfig()) as sim:
        requests.get(f"{sim.control_url}/api/v1/state")
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from prometheus_client import CollectorRegistry

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.collectors import FleetCollector, NodeCollector
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.control import Idempotency, control_handler
from gpuops.sim.fleet.listener import Listener, metrics_handler
from gpuops.sim.fleet.sd import scrape_configs, write_targets

log = logging.getLogger(__name__)


class FleetSim:
    """A running simulated fleet. ``start``/``stop`` or use it as a context manager."""

    def __init__(self, config: FleetConfig | None = None) -> None:
        self.config = config or FleetConfig()
        self.cluster = Cluster(self.config, on_topology=self.sync)
        self._listeners: dict[str, Listener] = {}
        self._sync_lock = threading.Lock()
        self._stop = threading.Event()
        self.failed = threading.Event()
        """Set when the clock stopped on an error (``error``): every listener is closed by
        then, so nothing serves a fleet whose time no longer moves."""
        self.error: BaseException | None = None
        self._ticker: threading.Thread | None = None
        self._tmpdir: str | None = None
        if self.config.sd_file is not None:
            self._sd_file = Path(self.config.sd_file).resolve()
        else:
            self._tmpdir = tempfile.mkdtemp(prefix="gpuops-fleet-")
            self._sd_file = Path(self._tmpdir) / "gpu-nodes.json"
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector(self.cluster))
        handler = control_handler(self.cluster, registry, Idempotency())
        self._control = Listener(self.config.host, self.config.control_port, handler, "control")
        self._started = False

    # --- properties ------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self.config.advertise_host or self.config.host

    @property
    def control_port(self) -> int:
        return self._control.port

    @property
    def control_url(self) -> str:
        return f"http://{self.host}:{self._control.port}"

    @property
    def sd_file(self) -> Path:
        return self._sd_file

    @property
    def node_ports(self) -> dict[str, int]:
        """Port of every node (failed ones included; their port refuses connections)."""
        with self._sync_lock:
            return {name: lst.port for name, lst in self._listeners.items()}

    def unopened_nodes(self) -> dict[str, int]:
        """Nodes not failed that do not listen, their port taken by another process: their
        ports (Prometheus reads them as down)."""
        with self._sync_lock, self.cluster.lock:
            failed = {n.name for n in self.cluster.nodes.values() if n.failed}
            return {
                name: lst.port
                for name, lst in self._listeners.items()
                if not lst.is_open and name not in failed
            }

    def node_url(self, node: str) -> str:
        return f"http://{self.host}:{self.node_ports[node]}/metrics"

    def scrape_config(self, scrape_interval: str = "15s") -> str:
        """YAML ``scrape_configs:`` for Prometheus: jobs ``gpu-nodes`` and ``gpuops-fleet``."""
        return scrape_configs(self._sd_file, f"{self.host}:{self.control_port}", scrape_interval)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FleetSim:
        if self._started:
            return self
        self._started = True
        try:
            self._control.open()
            self.sync()
        except BaseException:
            self.stop()
            raise
        self._stop.clear()
        self._ticker = threading.Thread(target=self._run, daemon=True, name="fleet-clock")
        self._ticker.start()
        log.info(
            "fleet control API and fleet /metrics on %s; %d nodes; file_sd %s",
            self.control_url,
            len(self._listeners),
            self._sd_file,
        )
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        self._close_listeners()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._started = False

    def __enter__(self) -> FleetSim:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        cfg = self.config
        last = time.monotonic()
        try:
            while not self._stop.wait(cfg.tick_s):
                now = time.monotonic()
                self.cluster.advance((now - last) * cfg.speed)
                last = now
        except Exception as exc:  # noqa: BLE001 - any error stops the fleet; its owner is told
            log.exception(
                "the fleet's clock stopped at %.0f s; closing its listeners", self.cluster.time
            )
            self.error = exc
            self._close_listeners()
            self.failed.set()

    def _close_listeners(self) -> None:
        self._control.close()
        with self._sync_lock:
            for listener in self._listeners.values():
                listener.close()
            self._listeners.clear()

    # --- topology ------------------------------------------------------------------------------

    def sync(self) -> None:
        """Make listeners and the file_sd file match the cluster's nodes.

        New node: a listener (on first_node_port + its number, or a free port). Failed node:
        listener closed, target kept (Prometheus sees up == 0). Restored: re-opened on its port.
        Removed node: listener closed and target dropped.
        """
        if not self._started or self.failed.is_set():
            return
        with self._sync_lock:
            with self.cluster.lock:
                nodes = {n.name: (n.pool, n.failed, n.seq) for n in self.cluster.nodes.values()}
            for name in set(self._listeners) - set(nodes):
                self._listeners.pop(name).close()
            for name, (_pool, failed, seq) in nodes.items():
                listener = self._listeners.get(name)
                if listener is None:
                    first = self.config.first_node_port
                    port = first + seq if first else 0
                    registry = CollectorRegistry(auto_describe=False)
                    registry.register(NodeCollector(self.cluster, name, self.config.driver_version))
                    listener = Listener(self.config.host, port, metrics_handler(registry), name)
                    self._listeners[name] = listener
                if failed:
                    listener.close()
                elif not listener.is_open:
                    try:
                        listener.open()
                    except OSError as exc:  # port taken: the node stays unreachable, as if down
                        log.error("node %s cannot listen on port %d: %s", name, listener.port, exc)
                        continue
                    log.info("node %s serves /metrics on %s:%d", name, self.host, listener.port)
            with self.cluster.lock:
                for name, listener in self._listeners.items():
                    node = self.cluster.nodes.get(name)
                    if node is not None:
                        node.port = listener.port
            targets = [(n, nodes[n][0], lst.port) for n, lst in self._listeners.items()]
            write_targets(self._sd_file, self.host, targets)
