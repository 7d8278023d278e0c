"""The Slurm exporter process: ``/metrics`` of a ``SlurmCollector`` on its own port. Built by
``gpuops.cli.exporter`` (``gpuops exporter slurm``) and by tests on port 0."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from gpuops.exporters.slurm.collector import SlurmCollector
from gpuops.integrations.slurm.client import SlurmClient

log = logging.getLogger(__name__)

DEFAULT_PORT = 9341
"""prometheus-slurm-exporter's port is 8080; gpuops' exporters sit near 9835 (NVML)."""


class SlurmExporter:
    def __init__(
        self,
        client: SlurmClient,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        gres_minors: Mapping[str, list[int]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.collector = SlurmCollector(client, gres_minors)
        self.registry.register(self.collector)
        self.host = host
        self._port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_port) if self._server else self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SlurmExporter:
        self._server, self._thread = start_http_server(self._port, self.host, self.registry)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
