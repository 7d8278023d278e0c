"""``/api/v1/docs``: Swagger UI for the API's OpenAPI spec, with its assets served by this
process from ``engine/api/swagger_ui`` (Swagger UI 5's own files, Apache-2.0, see SOURCE.md
there) under ``/static/swagger-ui`` — no CDN, so the page works on a site without internet.

Mounted by ``engine.api.app.create_app``; the page and its assets are open (no token), like the
spec, because they hold no data: the calls made from the page send the token typed into it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/swagger-ui"
FILES = Path(__file__).parent / "swagger_ui"


def mount_docs(app: FastAPI, openapi_url: str, docs_url: str) -> None:
    app.mount(ASSETS, StaticFiles(directory=FILES), name="swagger-ui")

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} — Swagger UI",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
