"""``ApiServer``: serves an API app with uvicorn on a background thread, over TLS when a
certificate and key are configured. Used by ``gpuops engine run`` and the integration tests
(which listen on port 0 and read the port back).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

log = logging.getLogger(__name__)


class ApiServerError(RuntimeError):
    """The server could not listen or did not start in time."""


class ApiServer:
    def __init__(
        self,
        app: ASGIApp,
        listen: str,
        tls_cert_file: Path | None = None,
        tls_key_file: Path | None = None,
    ) -> None:
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.requested_port = int(port)
        self.app = app
        self.tls = tls_cert_file is not None
        self._config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            ssl_certfile=str(tls_cert_file) if tls_cert_file else None,
            ssl_keyfile=str(tls_key_file) if tls_key_file else None,
            timeout_graceful_shutdown=10,
            # the audit's source.ip is the peer's address: uvicorn would otherwise take it from
            # X-Forwarded-For of any client on 127.0.0.1 (a local process forging its address)
            proxy_headers=False,
        )
        self._server = uvicorn.Server(self._config)
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def bind(self) -> ApiServer:
        """Take the listening socket now (``start`` serves on it), so that a port in use is
        known before anything else starts; ``ApiServerError`` when it cannot be had."""
        if self._socket is not None:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            self._socket = socket.create_server((self.host, self.requested_port), family=family)
        except OSError as exc:
            raise ApiServerError(
                f"API cannot listen on {self.host}:{self.requested_port}: "
                f"{os.strerror(exc.errno or 0)}"
            ) from None
        self.port = int(self._socket.getsockname()[1])
        return self

    def start(self, timeout: float = 15.0) -> ApiServer:
        self.bind()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="gpuops-api"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ApiServerError(f"API did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        log.info("API at %s/api/v1 (OpenAPI: %s/api/v1/openapi.json)", self.url, self.url)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
