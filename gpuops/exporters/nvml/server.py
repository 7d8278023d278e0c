"""The exporter process: one HTTP server for ``/metrics``, ``/healthz`` and, when enabled, the
node agent's ``/api/v1/gpus`` endpoints. ``gpuops.cli.exporter`` builds it from the command
line; tests build it on port 0 with a fake backend.

Agent endpoints (bearer token required; a decision id in the body or an ``Idempotency-Key``
header makes a repeated request a no-op):

- ``GET  /api/v1/gpus``                      supported clock and power ranges, lock state
- ``POST /api/v1/gpus/{uuid|index}/clocks``  ``{"max_clock_mhz": int, "min_clock_mhz": int?}``
- ``POST /api/v1/gpus/{uuid|index}/clocks/reset``
- ``POST /api/v1/gpus/{uuid|index}/power-limit``  ``{"watts": number}``
- ``POST /api/v1/gpus/{uuid|index}/reset``  reset the GPU (``nvidia-smi --gpu-reset``)
- ``POST /api/v1/gpus/{uuid|index}/check``  ``{"healthy": bool, "problems": [...]}`` by NVML
- ``GET  /api/v1/node``                      ``{"node": str, "boot_id": str, "reboot": true}``
  (``{"boot_id": null, "reboot": false}`` without ``--agent-reboot``)
- ``POST /api/v1/node/reboot``               ``{"decision_id": str, "node": str}``: reboot this
  node, which ``node`` must name, once per decision id (``--agent-reboot``;
  ``gpuops.exporters.nvml.reboot``)

Errors are JSON ``{"error": message}`` with 400 (bad value), 401 (token), 403 (NVML needs
root), 404, 409 (unsupported; a reboot meant for another node, or whose command failed or
never started), 410 (GPU lost), 503 (NVML unavailable; the reboot state cannot be kept).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gpuops.exporters.nvml import nvml
from gpuops.exporters.nvml.agent import AgentError, ClockAgent, GpuReset, nvidia_smi_reset
from gpuops.exporters.nvml.collector import NvmlCollector
from gpuops.exporters.nvml.events import XidWatcher
from gpuops.exporters.nvml.push import HealthPusher
from gpuops.exporters.nvml.reboot import Rebooter
from gpuops.exporters.nvml.session import NvmlSession

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024


class ExporterServer:
    """The NVML exporter (and optional node agent) over one backend, served on ``host:port``."""

    def __init__(
        self,
        backend: nvml.Backend,
        host: str = "",
        port: int = 9835,
        agent_token: str | None = None,
        xid_events: bool = True,
        xid_poll_ms: int = 500,
        push: HealthPusher | None = None,
        reset: GpuReset = nvidia_smi_reset,
        rebooter: Rebooter | None = None,
    ) -> None:
        """``reset``: how the agent resets a GPU (a fake NVML's own in tests and demos);
        ``rebooter``: the agent's reboot of the node (None: refused, it is off)."""
        self.session = NvmlSession(backend)
        self.push = push
        on_xid = push.xid if push is not None else None
        self.xids = (
            XidWatcher(self.session, poll_ms=xid_poll_ms, on_xid=on_xid) if xid_events else None
        )
        self.collector = NvmlCollector(
            self.session, self.xids, on_lost=push.lost if push is not None else None
        )
        self.registry = CollectorRegistry()  # what ``/metrics`` serves after the collector's
        if push is not None:
            self.registry.register(push)
        self.agent: ClockAgent | None = None
        self.rebooter = rebooter
        self._token = agent_token
        if agent_token is not None:
            if not agent_token:
                raise ValueError("the node agent needs a non-empty bearer token")
            self.agent = ClockAgent(self.session, reset=reset)
            self.registry.register(self.agent)
        self.httpd = _HTTPServer((host, port), _Handler, self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        """Serve on a background thread (tests, demo)."""
        self._start()
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.05,), name="nvml-exporter"
        )
        self._thread.daemon = True
        self._thread.start()

    def serve_forever(self) -> None:
        """Serve on this thread until interrupted (the command line)."""
        self._start()
        self.httpd.serve_forever()

    def _start(self) -> None:
        if self.rebooter is not None:
            self.rebooter.start()
        if self.push is not None:
            self.push.start()
        if self.xids is not None:
            self.xids.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        if self.xids is not None:
            self.xids.stop()
        if self.push is not None:
            self.push.stop()
        self.session.close()

    def authorized(self, header: str | None) -> bool:
        if self._token is None or not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].encode(), self._token.encode())


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, app: ExporterServer) -> None:
        self.app = app
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        log.debug("%s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] == "/metrics":
            app = self.server.app
            body = app.collector.render() + generate_latest(app.registry)
            self._send(200, body, CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif self.path == "/":
            self._send(200, b"gpuops NVML exporter: see /metrics\n", "text/plain; charset=utf-8")
        elif self.path == "/api/v1/gpus":
            agent = self._agent()
            if agent is not None:
                self._answer(lambda: {"gpus": agent.gpus()})
        elif self.path == "/api/v1/node":
            if self._agent() is not None:
                rebooter = self.server.app.rebooter
                if rebooter is None:
                    self._json(200, {"boot_id": None, "reboot": False})
                else:
                    self._answer(lambda: {**rebooter.node(), "reboot": True})
        else:
            self._json(404, {"error": f"no such path: {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path == "/api/v1/node/reboot":
            self._reboot()
            return
        parts = self.path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "gpus"] or len(parts) < 5:
            self._json(404, {"error": f"no such path: {self.path}"})
            return
        agent = self._agent()
        if agent is None:
            return
        body = self._body()
        if body is None:
            return
        ref, action = parts[3], "/".join(parts[4:])
        decision = body.get("decision_id") or self.headers.get("Idempotency-Key")
        decision = str(decision) if decision else None
        if action == "clocks":

            def lock() -> dict[str, Any]:
                max_mhz = _integer(body, "max_clock_mhz")
                if max_mhz is None:
                    raise _BadRequest("max_clock_mhz is required (MHz)")
                return agent.lock_clocks(ref, max_mhz, _integer(body, "min_clock_mhz"), decision)

            self._answer(lock)
        elif action == "clocks/reset":
            self._answer(lambda: agent.reset_clocks(ref, decision))
        elif action == "reset":
            self._answer(lambda: agent.reset_gpu(ref, decision))
        elif action == "check":
            self._answer(lambda: agent.check(ref))
        elif action == "power-limit":

            def power() -> dict[str, Any]:
                watts = body.get("watts")
                if (
                    not isinstance(watts, int | float)
                    or isinstance(watts, bool)
                    or not math.isfinite(watts)
                ):
                    raise _BadRequest("watts must be a finite number")
                return agent.set_power_limit(ref, float(watts), decision)

            self._answer(power)
        else:
            self._json(404, {"error": f"no such action: {action}"})

    def _reboot(self) -> None:
        """Reboot the node: answered first, the command started after the answer went out."""
        if self._agent() is None:
            return
        rebooter = self.server.app.rebooter
        if rebooter is None:
            self._json(
                404, {"error": "the node agent's reboot is off (start it with --agent-reboot)"}
            )
            return
        body = self._body()
        if body is None:
            return
        decision = body.get("decision_id") or self.headers.get("Idempotency-Key")
        node = body.get("node")
        if node is not None and not isinstance(node, str):
            self._json(400, {"error": "node must be a string: the name of the node to reboot"})
            return
        try:
            answer, start = rebooter.reboot(str(decision) if decision else None, node)
        except AgentError as exc:
            self._json(exc.status, {"error": exc.message})
            return
        try:
            self._json(200, answer)
            self.wfile.flush()
        finally:  # asked and recorded: started even when the asker went away meanwhile
            if start is not None:
                start()

    def _agent(self) -> ClockAgent | None:
        app = self.server.app
        if app.agent is None:
            self._json(404, {"error": "the node agent is off (start the exporter with --agent)"})
            return None
        if not app.authorized(self.headers.get("Authorization")):
            self._json(401, {"error": "a valid bearer token is required"}, bearer=True)
            return None
        return app.agent

    def _body(self) -> dict[str, Any] | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._json(400, {"error": "Content-Length must be a non-negative integer"})
            return None
        if length > MAX_BODY:
            self._json(413, {"error": f"body larger than {MAX_BODY} bytes"})
            return None
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            self._json(400, {"error": f"body is not JSON: {exc}"})
            return None
        if not isinstance(body, dict):
            self._json(400, {"error": "body must be a JSON object"})
            return None
        return body

    def _answer(self, call: Callable[[], dict[str, Any]]) -> None:
        try:
            result = call()
        except _BadRequest as exc:
            self._json(400, {"error": str(exc)})
        except AgentError as exc:
            self._json(exc.status, {"error": exc.message})
        else:
            self._json(200, result)

    def _json(self, status: int, doc: dict[str, Any], bearer: bool = False) -> None:
        extra = {"WWW-Authenticate": 'Bearer realm="gpuops-nvml-agent"'} if bearer else {}
        self._send(status, json.dumps(doc).encode() + b"\n", "application/json", extra)

    def _send(
        self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, val in (headers or {}).items():
            self.send_header(name, val)
        self.end_headers()
        self.wfile.write(body)


class _BadRequest(Exception):
    pass


def _integer(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadRequest(f"{key} must be an integer (MHz)")
    return value
