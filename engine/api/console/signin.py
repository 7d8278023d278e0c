"""``/login`` and ``/logout``: an API token exchanged for a session cookie, and back.

The sign-in form is protected by a double-submit CSRF cookie; a failed sign-in is audited as
``authenticate`` (like the API's 401s), a successful one as ``console_sign_in``. The token is
read from the form body only, never put in a URL, a page or a log.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine.api.console.sessions import COOKIE, LOGIN_COOKIE, same
from engine.api.console.web import AuditedRoute, ConsoleDep, Refused, ViewerDep, check_csrf, render

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)


def _local(path: str | None) -> str:
    """Only a path of this site is followed after sign-in (no ``//host`` or scheme)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


@router.get("/login", name="console_sign_in_page", response_class=HTMLResponse)
def sign_in_page(request: Request, c: ConsoleDep, next: str = "/") -> Response:
    csrf = secrets.token_urlsafe(32)
    response = render(request, "login.html", None, login_csrf=csrf, next=_local(next))
    response.set_cookie(
        LOGIN_COOKIE, csrf, max_age=600, httponly=True, secure=c.tls, samesite="strict"
    )
    return response


@router.post("/login", name="console_sign_in", response_class=HTMLResponse)
def sign_in(
    request: Request,
    c: ConsoleDep,
    token: Annotated[str, Form(max_length=4096)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
    next: Annotated[str, Form(max_length=2048)] = "/",
) -> Response:
    if not same(csrf, request.cookies.get(LOGIN_COOKIE)):
        raise Refused(403, "the sign-in form's CSRF token is missing or wrong: reload the page")
    found = c.sessions.sign_in(token.strip())
    if found is None:
        request.state.gpuops_action = "authenticate"  # what the gate calls a refused token
        request.state.gpuops_reason = "invalid token"
        fresh = secrets.token_urlsafe(32)
        refused = render(
            request, "login.html", None, 401, login_csrf=fresh, next=_local(next),
            error="That token is not valid. Paste the API token you were given (gpuops token new).",
        )  # fmt: skip
        refused.set_cookie(
            LOGIN_COOKIE, fresh, max_age=600, httponly=True, secure=c.tls, samesite="strict"
        )
        return refused
    session_id, session, principal = found
    request.state.console_user = principal
    response: Response = RedirectResponse(_local(next), 303)
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(c.sessions.ttl),
        httponly=True,
        secure=c.tls,
        samesite="strict",
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE)
    return response


@router.post("/logout", name="console_sign_out", response_class=HTMLResponse)
def sign_out(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    check_csrf(viewer, csrf)
    c.sessions.sign_out(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", 303)
    response.delete_cookie(COOKIE, path="/", httponly=True, secure=c.tls, samesite="strict")
    return response
