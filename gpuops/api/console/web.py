"""What every console page shares: the signed-in viewer, permission checks with a clear refusal,
CSRF checks, rendering, and ``AuditedRoute`` — the route class that audits each console request
as the API call it stands for (same user, roles, source IP; the route's ``name`` is the API's):
a document per form, refusal, failure and export, a count per page read.

Used by ``gpuops.api.console.pages`` and ``gpuops.api.console.actions``; built by
``gpuops.api.console.mount``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import anyio.to_thread
from fastapi import Depends, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from gpuops.api.console.sessions import COOKIE, Session, SessionStore, SignInLimiter, same
from gpuops.api.context import ApiContext, NotLeaderError  # a write sent to a standby
from gpuops.api.tokens import Permission, Principal
from gpuops.model.decisions import Verdict
from gpuops.model.telling import plural, verdict_words
from gpuops.settings import ConsoleSettings

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

PAGES: tuple[tuple[str, str, Permission], ...] = (
    ("/", "Overview", Permission.ENGINE_READ),
    ("/fleet", "Fleet", Permission.ENGINE_READ),
    ("/batch", "Batch", Permission.ENGINE_READ),
    ("/health", "Health", Permission.ENGINE_READ),
    ("/timeline", "Timeline", Permission.DECISIONS_READ),
    ("/decisions", "Decisions", Permission.DECISIONS_READ),
    ("/approvals", "Approvals", Permission.APPROVALS_READ),
    ("/quota", "Quota requests", Permission.QUOTA_READ),
    ("/rules", "Rules", Permission.RULES_READ),
    ("/audit", "Audit", Permission.AUDIT_READ),
)
"""The navigation: path, title and the permission a page needs (the same as its API route)."""


def environment() -> Environment:
    """The templates' environment: autoescaped, with ``plural`` as a filter
    (``{{ n | plural("policy", "policies") }}``: ``1 policy``, ``2 policies``) and
    ``verdict`` (``{{ "suppressed:cooldown" | verdict }}``: ``held by the cooldown``). A name a
    template uses and its route does not give is an error (``StrictUndefined``), never an
    empty cell; ``x is defined`` and ``x | default(...)`` still test for one."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined
    )
    env.filters["plural"] = plural
    env.filters["verdict"] = verdict_text
    return env


def verdict_text(token: object) -> str:
    """A verdict's token in words, as the CLI and the engine's log tell it; a token this
    version does not know is shown as it is."""
    try:
        return verdict_words(Verdict(str(token)), "")
    except ValueError:
        return str(token)


@dataclass(frozen=True)
class Console:
    """One per app (``app.state.console``)."""

    context: ApiContext
    sessions: SessionStore
    limiter: SignInLimiter
    settings: ConsoleSettings
    templates: Jinja2Templates
    tls: bool


@dataclass(frozen=True)
class Viewer:
    """The signed-in user of a request."""

    principal: Principal
    session: Session

    def can(self, permission: Permission) -> bool:
        return self.principal.can(permission)


class NotSignedIn(Exception):
    """No live session: the browser is sent to the sign-in page."""


class Refused(Exception):
    """A page or action the viewer may not have, or a request that cannot be served: rendered
    as a page saying why, with ``status``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


REFRESH = (0, 10, 30, 60)
"""The intervals a page that can reload itself offers, in seconds (0: never)."""


def refresh_every(value: int) -> int:
    """A page's ``refresh`` query parameter, refused (422) unless one of ``REFRESH``."""
    if value not in REFRESH:
        raise Refused(
            422, f"refresh: {value} is not one of {', '.join(str(r) for r in REFRESH)} (seconds)"
        )
    return value


def console(request: Request) -> Console:
    found: Console = request.app.state.console
    return found


def signed_in(request: Request) -> Viewer:
    """Route dependency: the viewer, or ``NotSignedIn``."""
    found = console(request).sessions.find(request.cookies.get(COOKIE))
    if found is None:
        raise NotSignedIn()
    viewer = Viewer(found[1], found[0])
    request.state.console_viewer = viewer
    return viewer


ConsoleDep = Annotated[Console, Depends(console)]
ViewerDep = Annotated[Viewer, Depends(signed_in)]


def need(viewer: Viewer, permission: Permission, what: str) -> None:
    """Refuse (403) unless the viewer holds ``permission``; the message says which."""
    if not viewer.can(permission):
        roles = ", ".join(viewer.principal.roles)
        raise Refused(
            403,
            f"{what} needs the permission {permission.value}; user {viewer.principal.name!r} "
            f"(roles: {roles}) does not have it.",
        )


def check_csrf(viewer: Viewer, token: str | None) -> None:
    if not same(token, viewer.session.csrf):
        raise Refused(
            403, "the form's CSRF token is missing or wrong: reload the page and submit it again"
        )


def when(epoch: float | None) -> str:
    """Unix seconds as an ISO time in UTC (``2026-10-01 09:30:00 UTC``), '—' for none."""
    if epoch is None:
        return "—"
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def grafana_link(settings: ConsoleSettings, labels: dict[str, str]) -> str | None:
    """The GPU fleet dashboard filtered to the target's labels (encoded: labels are data)."""
    if not settings.grafana_url:
        return None
    query = urlencode({f"var-{k}": v for k, v in sorted(labels.items())})
    return f"{settings.grafana_url.rstrip('/')}/d/gpuops-gpu-fleet?{query}"


def kibana_link(settings: ConsoleSettings, target_key: str) -> str | None:
    """Kibana Discover searching the audit for the target (KQL in rison, then URL-encoded)."""
    if not settings.kibana_url:
        return None
    value = target_key.replace("\\", "\\\\").replace('"', '\\"')
    kql = f'gpuops.target.key : "{value}"'.replace("!", "!!").replace("'", "!'")
    state = quote(f"(query:(language:kuery,query:'{kql}'))", safe="")
    return f"{settings.kibana_url.rstrip('/')}/app/discover#/?_a={state}"


def render(
    request: Request, template: str, viewer: Viewer | None, code: int = 200, **values: Any
) -> HTMLResponse:
    c = console(request)
    nav = [(path, title) for path, title, perm in PAGES if viewer is None or viewer.can(perm)]
    context = {
        "viewer": viewer,
        "standby": _standby(c) if viewer else None,
        "nav": nav if viewer else [],
        "csrf": viewer.session.csrf if viewer else "",
        "when": when,
        "path": request.url.path,
        **values,
    }
    response = c.templates.TemplateResponse(request, template, context, status_code=code)
    response.headers["cache-control"] = "no-store"
    response.headers["x-frame-options"] = "DENY"
    response.headers["content-security-policy"] = (
        "default-src 'self'; style-src 'self'; img-src 'self'; script-src 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )
    response.headers["referrer-policy"] = "same-origin"
    response.headers["x-content-type-options"] = "nosniff"
    return response


def _standby(c: Console) -> dict[str, str | None] | None:
    """What the banner of a standby replica's pages says (docs/ha.md), None on the leader:
    the leader's name, and its console URL when it advertises an http(s) one."""
    engine = c.context.engine
    if engine.leading():
        return None
    info = engine.leadership.leader()
    if info is None or not info.holder or info.expires_in <= 0:
        return {"leader": None, "url": None}
    return {"leader": info.holder, "url": info.link}


EXPORTS = frozenset({"search_audit_export"})
"""Console reads that are each a document all the same: an export takes the audit away."""


def _record(
    request: Request,
    principal: Principal | None,
    action: str,
    status: int,
    reason: str | None,
    note: str | None,
) -> None:
    """The audit record of one console request, shaped like ``gpuops.api.middleware``'s; a
    page a signed-in user read is counted (``gpuops_audit_reads_total``), not written."""
    audit = console(request).context.engine.audit
    user = principal.name if principal else "anonymous"
    if request.method in ("GET", "HEAD") and status < 400 and action not in EXPORTS:
        audit.read(user, action, "console")  # the sign-in page too, as anonymous
        return
    roles = list(principal.roles) if principal else []
    client = request.client
    method, path = request.method, request.url.path
    details = {"method": method, "path": path, "status": status, "route": action, "via": "console"}
    message = f"{user} {method} {path} (console) -> {status}" + (f": {reason}" if reason else "")
    if note:  # what the user wrote as the reason of a grant or denial
        details["note"] = note
        message += f" ({note})"
    audit.operation(
        user,
        roles,
        action,
        "success" if status < 400 else "failure",
        client.host if client else None,
        message,
        details,
        f"{status}: {reason}" if reason else None,
    )


class AuditedRoute(APIRoute):
    """Audits every request of the route under the route's ``name`` (the API route it stands
    for), turns ``Refused``, ``HTTPException`` and any other exception (500, its type only)
    into pages and ``NotSignedIn`` into the sign-in page. The record is written before the
    answer goes out."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        action = self.name

        async def audited(request: Request) -> Response:
            reason: str | None = None
            try:
                _check_length(request)
                response = await handler(request)
            except NotSignedIn:
                if request.method == "GET":  # a page view before sign-in: not an operation
                    return RedirectResponse(f"/login?next={_asked(request)}", 303)
                reason = "not signed in (or the session expired): sign in again"
                response = render(request, "message.html", None, 401, title="Sign in", text=reason)
            except Refused as exc:
                reason = exc.reason
                response = render(
                    request, "message.html", _viewer(request), exc.status, title="Refused",
                    text=reason,
                )  # fmt: skip
            except RequestValidationError as exc:
                reason = "; ".join(
                    f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', '')}"
                    for err in exc.errors()
                )
                response = render(
                    request, "message.html", _viewer(request), 422, title="Not done", text=reason
                )
            except NotLeaderError as exc:  # a form sent to a standby: the leader takes it
                reason = str(exc)
                response = render(
                    request, "message.html", _viewer(request), 503, title="Not done",
                    text=reason,
                )  # fmt: skip
                leader = exc.leader
                if leader is not None and leader.link and leader.expires_in > 0:
                    response.headers["X-Gpuops-Leader"] = leader.link
            except HTTPException as exc:
                reason = str(exc.detail)
                response = render(
                    request, "message.html", _viewer(request), exc.status_code,
                    title="Not done", text=reason,
                )  # fmt: skip
            except Exception as exc:  # a bug: still a page and an audit record, no details shown
                log.exception("console %s %s failed", request.method, request.url.path)
                reason = f"internal error ({type(exc).__name__}); the engine's log has the details"
                response = render(
                    request, "message.html", _viewer(request), 500, title="Not done", text=reason
                )
            reason = reason or getattr(request.state, "gpuops_reason", None)
            principal = _principal(request)
            name = getattr(request.state, "gpuops_action", None) or action
            try:
                await anyio.to_thread.run_sync(
                    _record,
                    request,
                    principal,
                    name,
                    response.status_code,
                    reason if response.status_code >= 400 else None,
                    getattr(request.state, "console_note", None),
                )
            except Exception:  # the audit's own failure is counted there; the answer stands
                log.exception("could not audit console %s %s", request.method, request.url.path)
            return response

        return audited


def _asked(request: Request) -> str:
    """The page asked for, with its query (the filters) when it fits the sign-in form's
    ``next`` field, encoded as one query value."""
    asked = request.url.path
    if request.url.query and len(asked) + len(request.url.query) < 2000:
        asked += f"?{request.url.query}"
    return quote(asked, safe="/")


def _check_length(request: Request) -> None:
    """Form bodies are read whole: refuse one over the API's ``max_body_bytes`` (413), and one
    that does not say its length (411; browsers always do), before reading it."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    limit = console(request).context.settings.max_body_bytes
    length = request.headers.get("content-length")
    if length is None or not length.isdigit():
        raise Refused(411, "the form was sent without a valid Content-Length")
    if int(length) > limit:
        raise Refused(413, f"the form's {length} bytes exceed the limit of {limit} bytes")


def _principal(request: Request) -> Principal | None:
    """Who to audit: the viewer, the user just signed in, or the session's user when the
    request was refused before the page looked (a body too large)."""
    viewer = _viewer(request)
    if viewer is not None:
        return viewer.principal
    just_signed_in: Principal | None = getattr(request.state, "console_user", None)
    if just_signed_in is not None:
        return just_signed_in
    found = console(request).sessions.find(request.cookies.get(COOKIE))
    return found[1] if found else None


def _viewer(request: Request) -> Viewer | None:
    viewer: Viewer | None = getattr(request.state, "console_viewer", None)
    return viewer
