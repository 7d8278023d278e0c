"""The ASGI middleware in front of every ``/api/v1`` route: request-size limit, authentication
(bearer token, or HTTP Basic with the token as password) and the audit record of the call — one
document per change, refusal or failure, and per search of the audit (``EXPORTS``); a successful
read (a GET) is counted (``gpuops_audit_reads_total`` by route and user), not written.

Bodies are checked as they stream in, whatever the framing (Content-Length or chunked): one
over its route's limit is answered 413, a JSON body that is not UTF-8 422, whatever the route
would have said about the truncated read.

Installed by ``gpuops.api.app.create_app``; the route dependencies of ``gpuops.api.auth`` check
permissions of the principal it leaves in the request state. Credentials are never logged,
audited or echoed: messages name the user at most.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuops.api.tokens import Principal, TokenStore

log = logging.getLogger(__name__)


class Recorder(Protocol):
    """What records a call: ``gpuops.audit.log.AuditLog.operation``."""

    def __call__(
        self,
        user: str,
        roles: Sequence[str],
        action: str,
        outcome: str,
        source_ip: str | None,
        message: str,
        details: Mapping[str, str | int | None] | None = None,
        error: str | None = None,
    ) -> object: ...


class ReadCounter(Protocol):
    """What counts a successful read: ``gpuops.audit.log.AuditLog.read``."""

    def __call__(self, user: str, route: str, via: str) -> object: ...


READS = frozenset({"GET", "HEAD"})
EXPORTS = frozenset({"search_audit"})
"""Reads that are each a document all the same: a search of the audit hands its documents to
a program, as an export does."""


@dataclass
class _Answer:
    """What became of one call so far: the status sent (0: none yet), whether it is audited."""

    status: int = 0
    audited: bool = False


class _TooLarge(Exception):
    pass


class _NotUtf8(Exception):
    pass


class ApiMiddleware:
    """Authenticates, limits and audits requests under ``prefix`` (except ``open_paths``)."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenStore,
        record: Recorder,
        max_body_bytes: int,
        prefix: str = "/api/v1",
        open_paths: frozenset[str] = frozenset(),
        body_limits: Mapping[str, int] | None = None,
        count_read: ReadCounter | None = None,
    ) -> None:
        """``count_read``: counts successful reads instead of recording them (None: every
        call is recorded)."""
        self.app = app
        self.tokens = tokens
        self.record = record
        self.count_read = count_read
        self.max_body_bytes = max_body_bytes
        self.body_limits = dict(body_limits or {})
        """Limits of particular paths (the Alertmanager receiver's groups are larger)."""
        self.prefix = prefix
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self.prefix) or path in self.open_paths:
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        sent = _Answer()
        claimed = "anonymous"
        principal: Principal | None = None
        limit = self.body_limits.get(path, self.max_body_bytes)
        refused: dict[str, tuple[int, str]] = {}  # the body's own problem, answered instead

        async def audit_once() -> None:
            if not sent.audited:
                sent.audited = True
                await self._audit(scope, state, principal, claimed, sent.status or 500)

        async def send_audited(message: Message) -> None:
            if refused:
                return  # what the route made of a body cut short is not the answer
            # The call is audited before the last byte of the answer leaves: whoever got an
            # answer finds its audit record.
            if message["type"] == "http.response.start":
                sent.status = message["status"]
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
            problem = self._length_problem(scope, limit)
            if problem is not None:
                state["gpuops_reason"] = problem[1]
                await _reply(send_audited, problem[0], problem[1])
                return
            json_body = (_header(scope, b"content-type") or "").startswith("application/json")
            await self.app(scope, _checked(receive, limit, json_body, refused), send_audited)
        except (_TooLarge, _NotUtf8):
            pass  # answered below
        except Exception as exc:
            if not refused:
                state.setdefault("gpuops_reason", f"internal error: {type(exc).__name__}")
                sent.status = sent.status or 500
                raise
        finally:
            if refused and not sent.status:
                status, reason = refused.pop("body")
                state["gpuops_reason"] = reason
                await _reply(send_audited, status, reason)
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

    def _length_problem(self, scope: Scope, limit: int) -> tuple[int, str] | None:
        length = _header(scope, b"content-length")
        if length is None:
            return None
        if not length.isdigit():
            return 400, "Content-Length is not a number"
        if int(length) > limit:
            return 413, f"request body of {length} bytes exceeds the limit of {limit}"
        return None

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
        if (
            self.count_read is not None
            and principal is not None
            and route_name is not None
            and method in READS
            and status < 400
            and route_name not in EXPORTS
        ):
            self.count_read(user, route_name, "api")
            return
        details = {"method": method, "path": path, "status": status, "route": route_name}
        message = f"{user} {method} {path} -> {status}" + (f": {reason}" if reason else "")
        if note := state.get("gpuops_note"):  # the reason given for a grant or denial
            details["note"] = note
            message += f" ({note})"
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


def _checked(
    receive: Receive, limit: int, json_body: bool, refused: dict[str, tuple[int, str]]
) -> Receive:
    """``receive`` that counts the body against ``limit`` and, for JSON, decodes it as UTF-8
    as it comes; a problem is left in ``refused`` (the answer) and ends the read."""
    seen = 0
    decoder = codecs.getincrementaldecoder("utf-8")()

    async def checked() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if seen + len(chunk) > limit:
                refused["body"] = (413, f"request body larger than {limit} bytes")
                raise _TooLarge
            if json_body:
                try:
                    decoder.decode(chunk, final=not message.get("more_body", False))
                except UnicodeDecodeError as exc:
                    at = seen + exc.start
                    refused["body"] = (422, f"JSON body is not UTF-8 (byte {at} is invalid)")
                    raise _NotUtf8 from None
            seen += len(chunk)
        return message

    return checked


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
