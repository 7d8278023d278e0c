"""The engine's Prometheus client over real connections to loopback servers: a refused
connection is short and not retried, the proxy and netrc environment is read once when the
client is made, and an answer is read in one call over one kept connection (gzip, a cut or
broken answer is a QueryError naming why)."""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs

import orjson
import pytest

from gpuops.sources import QueryError
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promproc import free_port


def vector(*series: tuple[dict[str, str], str]) -> dict[str, object]:
    result = [{"metric": m, "value": [1700000000.0, v]} for m, v in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_refused_connection_is_short_and_not_retried() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(QueryError) as caught:
        PrometheusClient(url).query("up")
    assert str(caught.value) == f"Prometheus at {url} unreachable: connection refused"


def test_the_environment_is_read_once_when_the_client_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """requests would read the proxy variables and the netrc file again for every query
    (~20 % of a request's CPU); the client takes them when it is made and keeps them: the proxy
    and the netrc credentials still apply, NO_PROXY still excludes, and a later change of the
    environment does not change where a running engine's queries go."""
    seen: list[tuple[str, str]] = []
    body = json.dumps(vector(({"uuid": "a"}, "1"))).encode()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization", "")))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with served(Proxy) as proxy:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        netrc = tmp_path / "netrc"
        netrc.write_text("machine prometheus.example login ops password s3cret\n")
        monkeypatch.setenv("NETRC", str(netrc))
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        via_proxy = PrometheusClient("http://prometheus.example:9090")
        direct = PrometheusClient(proxy)  # NO_PROXY: straight to the server, no credentials
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # refused
        monkeypatch.delenv("NO_PROXY")
        netrc.unlink()
        assert [s.value for s in via_proxy.query("up")] == [1.0]
        assert [s.value for s in direct.query("up")] == [1.0]
        basic = "Basic " + base64.b64encode(b"ops:s3cret").decode()
        assert seen == [
            ("http://prometheus.example:9090/api/v1/query?query=up", basic),
            ("/api/v1/query?query=up", ""),
        ]


def test_answers_are_read_in_one_call_over_one_kept_connection() -> None:
    """The body is read raw in one call (requests' ``content`` would read it 10 kB at a
    time). The connection still goes back to the pool for the next query, a gzip answer is
    still decoded, and an answer cut short (the server gone mid-answer) or sent with a
    broken gzip stream is a QueryError naming why, after which the next query works."""
    body = orjson.dumps(vector(({"uuid": "a"}, "1"), ({"uuid": "b"}, "2")))
    connections: list[int] = []

    class Server(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            connections.append(1)
            super().setup()

        def do_GET(self) -> None:
            query = parse_qs(self.path.split("?", 1)[1])["query"][0]
            payload = {"gz": gzip.compress(body), "badgz": b"\x1f\x8bnot gzip"}.get(query, body)
            self.send_response(200)
            if query in ("gz", "badgz"):
                self.send_header("Content-Encoding", "gzip")
            length = len(payload) + (100 if query == "cut" else 0)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(payload)
            if query == "cut":  # 100 bytes promised, never sent: the server goes away
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    with served(Server) as url:
        client = PrometheusClient(url)
        for expr in ("up", "x", "gz"):
            assert [s.value for s in client.query(expr)] == [1.0, 2.0]
        assert len(connections) == 1  # kept: one connection for the three
        cut = f"^Prometheus at {url} unreachable: Connection broken: IncompleteRead\\("
        with pytest.raises(QueryError, match=cut):
            client.query("cut")
        with pytest.raises(QueryError, match=f"^Prometheus at {url} sent an unreadable answer$"):
            client.query("badgz")
        assert [s.value for s in client.query("up")] == [1.0, 2.0]


@contextmanager
def served(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A loopback HTTP server answering with ``handler``, its URL while the block runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
