"""The web console: server-rendered pages for the people who approve, audit and stop, served by
the API's own app under ``/`` (``mount_console``, called by ``gpuops.api.app.create_app``).

Sign-in exchanges an API token for a session cookie (``sessions``); every page and form needs
the permission of the API route it stands for and is audited under that route's name (``web``).
Templates and the stylesheet are in this package; no script and nothing from another site.
``docs`` serves Swagger UI from the locally installed ``swagger-ui-bundle`` assets.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from gpuops.api.console import actions, batch, fleet, health, pages, signin
from gpuops.api.console.sessions import SessionStore, SignInLimiter
from gpuops.api.console.web import STATIC, Console, environment
from gpuops.api.context import ApiContext

__all__ = ["mount_console"]


def mount_console(app: FastAPI, context: ApiContext) -> Console:
    """Add the console's routes and its static files to ``app``."""
    settings = context.settings.console
    templates = Jinja2Templates(env=environment())
    console = Console(
        context=context,
        sessions=SessionStore(context.tokens, settings.session_ttl, context.engine.clock),
        limiter=SignInLimiter(
            settings.sign_in_failures, settings.sign_in_window, context.engine.clock
        ),
        settings=settings,
        templates=templates,
        tls=context.settings.tls_cert_file is not None,
    )
    app.state.console = console
    app.mount("/static/console", StaticFiles(directory=STATIC), name="console-static")
    for module in (signin, pages, actions, fleet, batch, health):
        app.include_router(module.router)
    return console
