"""``/api/v1/docs`` (Swagger UI) and ``/api/v1/redoc`` (ReDoc) for the API's OpenAPI spec, their
assets served by this process from ``gpuops/api/swagger_ui`` (Swagger UI 5, Apache-2.0) and
``gpuops/api/redoc`` (ReDoc 2, MIT) — see SOURCE.md in each — under ``/static/`` — no CDN and no
web fonts, so the pages work on a site without internet.

Mounted by ``gpuops.api.app.create_app``; the page and its assets are open (no token), like the
spec, because they hold no data: the calls made from the page send the token typed into it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/swagger-ui"
FILES = Path(__file__).parent / "swagger_ui"
REDOC_ASSETS = "/static/redoc"
REDOC_FILES = Path(__file__).parent / "redoc"


def mount_docs(app: FastAPI, openapi_url: str, docs_url: str, redoc_url: str) -> None:
    app.mount(ASSETS, StaticFiles(directory=FILES), name="swagger-ui")
    app.mount(REDOC_ASSETS, StaticFiles(directory=REDOC_FILES), name="redoc")

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} — Swagger UI",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    @app.get(redoc_url, include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} — ReDoc",
            redoc_js_url=f"{REDOC_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon-32x32.png",
            with_google_fonts=False,
        )
