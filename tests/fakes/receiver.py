"""A scripted HTTP receiver on a loopback port 0 (stdlib ``http.server`` in a thread): what
the webhook executor's integration tests send to, in place of a team's real endpoint."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``hold``: answer nothing until the receiver closes (a hung server);
    ``delay``: answer after this many seconds (a slow server; nothing if it closes first)."""

    status: int = 200
    body: bytes = b'{"ok": true}'
    headers: Mapping[str, str] = field(default_factory=dict)
    hold: bool = False
    delay: float = 0.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: Mapping[str, str]
    body: bytes
    signature_ok: bool | None
    """The HMAC the receiver computed over the body matched the header (None: no secret)."""


class Receiver:
    """Answers POSTs with the scripted replies in order (the last one repeats) and records what
    it received, checking ``X-Gpuops-Signature`` with ``secret`` the way a real receiver would."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret
        self.replies: list[Reply] = [Reply()]
        self.received: list[Received] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                reply = receiver.record(self.path, dict(self.headers.items()), body)
                if reply.hold:
                    receiver.released.wait(30)
                    return
                if reply.delay and receiver.released.wait(reply.delay):
                    return
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a delayed answer after its timeout)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = False  # server_close joins the handler threads
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.02,), name="receiver"
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies = list(replies)

    def record(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        ok = None
        if self.secret is not None:
            expected = "sha256=" + hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            ok = hmac.compare_digest(expected, headers.get("X-Gpuops-Signature", ""))
        with self._lock:
            self.received.append(Received(path, headers, body, ok))
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
