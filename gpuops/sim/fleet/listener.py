"""HTTP listeners of the simulated fleet: a threaded stdlib server that can be closed and
re-opened on the same port (a failed node closes its listener so Prometheus sees ``up == 0``).

Used by ``gpuops.sim.fleet.sim`` for every node's /metrics and, with the control handler of
``gpuops.sim.fleet.control``, for the control API.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class QuietHandler(BaseHTTPRequestHandler):
    """Request lines go to this module's logger at debug level, not to stderr."""

    protocol_version = "HTTP/1.0"  # one request per connection: closing the port cuts it off

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        log.debug("%s %s", self.address_string(), format % args)

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def metrics_handler(registry: CollectorRegistry) -> type[QuietHandler]:
    """A handler class that serves ``registry`` on /metrics (and / ) and 404 elsewhere."""

    class MetricsHandler(QuietHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_body(404, b"not found; try /metrics\n", "text/plain")
                return
            self.send_body(200, generate_latest(registry), CONTENT_TYPE_LATEST)

        do_HEAD = do_GET

    return MetricsHandler


class Listener:
    """One TCP listener serving ``handler``; ``open`` binds (``port`` 0: a free one, remembered
    for the next ``open``), ``close`` stops serving and releases the port."""

    def __init__(
        self, host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str
    ) -> None:
        self.host = host
        self.port = port
        self.handler = handler
        self.name = name
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def is_open(self) -> bool:
        return self._server is not None

    def open(self) -> int:
        """Start serving; returns the bound port. Raises OSError when the port is taken."""
        if self._server is not None:
            return self.port
        server = _Server((self.host, self.port), self.handler)
        self.port = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name=f"fleet-{self.name}",
        )
        thread.start()
        self._server, self._thread = server, thread
        log.debug("%s listening on %s:%d", self.name, self.host, self.port)
        return self.port

    def close(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        log.debug("%s closed port %d", self.name, self.port)
