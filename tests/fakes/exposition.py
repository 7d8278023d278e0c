"""A scripted Prometheus exporter on a loopback port 0 (stdlib ``http.server`` in a thread): it
serves ``/metrics`` in the text exposition format with the series a test sets, as the exporters
a Kubernetes cluster runs (dcgm-exporter, kube-state-metrics, Kueue) would write them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Exporter:
    """``set(name, labels, value)`` a series; ``drop(name, labels)`` ends it; ``read_at``:
    when set, every sample carries the time it returns (Unix seconds), as an exporter that
    serves what it read then (a time that stops moving: a stuck exporter serving its last
    read, which Prometheus keeps as it is, with no staleness marker)."""

    def __init__(self) -> None:
        self.read_at: Callable[[], float] | None = None
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def set(self, name: str, labels: Mapping[str, str], value: float) -> None:
        with self._lock:
            self._series[(name, tuple(sorted(labels.items())))] = value

    def text(self) -> str:
        with self._lock:
            lines = []
            at = "" if self.read_at is None else f" {int(self.read_at() * 1000)}"
            for (name, labels), value in sorted(self._series.items()):
                inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{name}{{{inner}}} {value:g}{at}")
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
