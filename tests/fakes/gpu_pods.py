"""Prometheus' instant query (``/api/v1/query``) on a loopback port 0, answering only what the
``kubernetes`` executor asks to find the pod holding a GPU (``gpuops.actions.kubepods``):
``timestamp(SERIES{UUID="...",pod!=""})`` of dcgm-exporter's series, one sample per GPU in
``gpus`` naming its pod, its newest sample ``age_s`` old. Everything asked is kept in
``asked``."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class GpuPods:
    """``gpus``: a GPU's UUID to (node, namespace, pod)."""

    def __init__(
        self, gpus: Mapping[str, tuple[str, str, str]], age_s: float = 2.0, at: float = 100.0
    ) -> None:
        self.gpus = dict(gpus)
        self.age_s = age_s
        self.at = at
        """The evaluation time answered."""
        self.asked: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                query = parse_qs(urlsplit(self.path).query)["query"][0]
                body = json.dumps(fake.answer(query)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, query: str) -> dict[str, object]:
        self.asked.append(query)
        at = self.at
        result = []
        for uuid, (node, namespace, pod) in self.gpus.items():
            if f'UUID="{uuid}"' in query:
                metric = {
                    "__name__": "DCGM_FI_DEV_GPU_UTIL",
                    "UUID": uuid,
                    "gpu": "0",
                    "Hostname": node,
                    "namespace": namespace,
                    "pod": pod,
                }
                # timestamp(): the evaluation time, then the time of the newest sample
                result.append({"metric": metric, "value": [at, str(at - self.age_s)]})
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
