"""``/login`` and ``/logout``: an API token exchanged for a session cookie, and back.

The sign-in form is protected by a double-submit CSRF cookie; a failed sign-in is audited as
``authenticate`` (like the API's 401s), a successful one as ``console_sign_in``. After
``api.console.sign_in_failures`` failures from one source address within ``sign_in_window``,
sign-in from it is refused (429 with Retry-After, audited as ``authenticate``) without trying
the token. The token is
read from the form body only, never put in a URL, a page or a log.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gpuops.api.console.sessions import COOKIE, LOGIN_COOKIE, same
from gpuops.api.console.web import AuditedRoute, ConsoleDep, Refused, ViewerDep, check_csrf, render

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)


def _local(path: str | None) -> str:
    """Only a path of this site is followed after sign-in (no ``//host`` or scheme)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


@router.get("/login", name="console_sign_in_page", response_class=HTMLResponse)
def sign_in_page(request: Request, c: ConsoleDep, next: str = "/") -> Response:
    csrf = secrets.token_urlsafe(32)
    response = render(request, "login.html", None, login_csrf=csrf, next=_local(next), error=None)
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
    address = request.client.host if request.client else "unknown"
    wait = c.limiter.retry_after(address)
    if wait is not None:  # no token is tried: guessing stops here, and costs no hashing
        request.state.gpuops_action = "authenticate"
        request.state.gpuops_reason = (
            f"too many failed sign-ins from {address} ({c.limiter.failures} within "
            f"{c.limiter.window:g} s): try again in {wait} s"
        )
        held = _sign_in_again(
            request, c, next, 429, f"Too many failed sign-ins from {address}: try again in "
            f"{wait} seconds.",
        )  # fmt: skip
        held.headers["retry-after"] = str(wait)
        return held
    found = c.sessions.sign_in(token.strip())
    if found is None:
        c.limiter.failed(address)
        request.state.gpuops_action = "authenticate"  # what the gate calls a refused token
        request.state.gpuops_reason = "invalid token"
        return _sign_in_again(
            request, c, next, 401,
            "That token is not valid. Paste the API token you were given (gpuops token new).",
        )  # fmt: skip
    c.sessions.sign_out(request.cookies.get(COOKIE))  # the browser's previous one, if any
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


def _sign_in_again(request: Request, c: ConsoleDep, next: str, code: int, error: str) -> Response:
    """The sign-in page once more, with ``error`` and a fresh CSRF cookie."""
    fresh = secrets.token_urlsafe(32)
    page = render(
        request, "login.html", None, code, login_csrf=fresh, next=_local(next), error=error
    )
    page.set_cookie(
        LOGIN_COOKIE, fresh, max_age=600, httponly=True, secure=c.tls, samesite="strict"
    )
    return page


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
