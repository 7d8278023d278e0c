"""The ASGI middleware in front of every ``/api/v1`` route: request-size limit, authentication
(bearer token, or HTTP Basic with the token as password) and the audit record of the call.

Installed by ``engine.api.app.create_app``; the route dependencies of ``engine.api.auth`` check
permissions of the principal it leaves in the request state. Credentials are never logged,
audited or echoed: messages name the user at most.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.api.tokens import Principal, TokenStore

log = logging.getLogger(__name__)

Recorder = Callable[..., object]
"""``AuditLog.operation``-shaped: (user, roles, action, outcome, source_ip, message, details,
error)."""


class _TooLarge(Exception):
    pass


class ApiGate:
    """Authenticates, limits and audits requests under ``prefix`` (except ``open_paths``)."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenStore,
        record: Recorder,
        max_body_bytes: int,
        prefix: str = "/api/v1",
        open_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.record = record
        self.max_body_bytes = max_body_bytes
        self.prefix = prefix
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self.prefix) or path in self.open_paths:
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        sent = {"status": 0, "audited": False}
        claimed = "anonymous"
        principal: Principal | None = None

        async def audit_once() -> None:
            if not sent["audited"]:
                sent["audited"] = True
                await self._audit(scope, state, principal, claimed, sent["status"] or 500)

        async def send_audited(message: Message) -> None:
            # The call is audited before the last byte of the answer leaves: whoever got an
            # answer finds its audit record.
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                await audit_once()
            await send(message)

        try:
            principal, claimed, reason = self._authenticate(scope)
            if principal is None:
                state["gpuops_reason"] = reason
                await _reply(
                    send_audited, 401, reason, {"www-authenticate": 'Bearer realm="gpuops"'}
                )
                return
            state["principal"] = principal
            problem = self._length_problem(scope)
            if problem is not None:
                state["gpuops_reason"] = problem[1]
                await _reply(send_audited, problem[0], problem[1])
                return
            await self.app(scope, self._limited(receive), send_audited)
        except _TooLarge:
            reason = f"request body larger than {self.max_body_bytes} bytes"
            state["gpuops_reason"] = reason
            if not sent["status"]:
                await _reply(send_audited, 413, reason)
        except Exception as exc:
            state.setdefault("gpuops_reason", f"internal error: {type(exc).__name__}")
            sent["status"] = sent["status"] or 500
            raise
        finally:
            await audit_once()

    def _authenticate(self, scope: Scope) -> tuple[Principal | None, str, str]:
        header = _header(scope, b"authorization")
        if not header:
            return None, "anonymous", "no credentials: send 'Authorization: Bearer <token>'"
        scheme, _, value = header.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value:
            found = self.tokens.authenticate(value)
            return found, found.name if found else "anonymous", "invalid bearer token"
        if scheme.lower() == "basic" and value:
            try:
                username, sep, password = (
                    base64.b64decode(value, validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError):
                return None, "anonymous", "malformed Basic credentials"
            found = self.tokens.authenticate_basic(username, password) if sep else None
            # only a known user name goes into the audit: what a client claims may be a token
            # (user name and password swapped in a Basic config)
            known = {user.name for user in self.tokens.users}
            claimed = username if sep and username in known else "unknown"
            return (
                found,
                claimed,
                "invalid user name or token (Basic: user name, token as password)",
            )
        return None, "anonymous", "unsupported Authorization scheme (use Bearer or Basic)"

    def _length_problem(self, scope: Scope) -> tuple[int, str] | None:
        length = _header(scope, b"content-length")
        if length is None:
            return None
        if not length.isdigit():
            return 400, "Content-Length is not a number"
        if int(length) > self.max_body_bytes:
            return 413, f"request body of {length} bytes exceeds the limit of {self.max_body_bytes}"
        return None

    def _limited(self, receive: Receive) -> Receive:
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _TooLarge
            return message

        return limited

    async def _audit(
        self,
        scope: Scope,
        state: dict[str, Any],
        principal: Principal | None,
        claimed: str,
        status: int,
    ) -> None:
        route = scope.get("route")
        route_name = getattr(route, "name", None)
        action = route_name or ("authenticate" if status == 401 else "unknown_route")
        if status == 401:
            action = "authenticate"
        method, path = scope.get("method", ""), scope.get("path", "")
        client = scope.get("client")
        reason = state.get("gpuops_reason") if status >= 400 else None
        user = principal.name if principal else claimed
        details = {"method": method, "path": path, "status": status, "route": route_name}
        message = f"{user} {method} {path} -> {status}" + (f": {reason}" if reason else "")
        try:
            await anyio.to_thread.run_sync(
                lambda: self.record(
                    user,
                    list(principal.roles) if principal else [],
                    action,
                    "success" if status < 400 else "failure",
                    client[0] if client else None,
                    message,
                    details,
                    f"{status}: {reason}" if reason else None,
                )
            )
        except Exception:  # the audit's own failure is counted there; the answer stands
            log.exception("could not audit %s %s", method, path)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _reply(
    send: Send, status: int, reason: str, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps({"detail": reason}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
