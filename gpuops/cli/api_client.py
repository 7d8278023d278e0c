"""The client side of the engine's REST API for the CLI: connection options (``--url``,
``--token`` or ``GPUOPS_URL``/``GPUOPS_TOKEN``), one ``ApiClient`` doing the HTTP, and table
or ``--json`` output. Used by ``gpuops.cli.remote`` and ``gpuops rules list|show|reload``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import requests

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "http://127.0.0.1:9843"


class ApiClient:
    """Calls one engine's API; any answer but 2xx becomes a ``click.ClickException``."""

    def __init__(
        self, url: str, token: str | None, ca_file: str | None = None, insecure: bool = False
    ) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        # Given per request: a session's verify loses to REQUESTS_CA_BUNDLE in the environment.
        self.verify: bool | str = False if insecure else (ca_file or True)

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        text: str | None = None,
    ) -> Any:
        headers = {"Content-Type": "text/plain; charset=utf-8"} if text is not None else {}
        try:
            resp = self.session.request(
                method,
                f"{self.url}/api/v1{path}",
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=json_body,
                data=text.encode("utf-8") if text is not None else None,
                headers=headers,
                timeout=60,
                verify=self.verify,
            )
        except requests.RequestException as exc:
            raise click.ClickException(
                f"cannot reach the engine API at {self.url}: {_why(exc)} "
                "(is the engine running? GPUOPS_URL or --url names it)"
            ) from None
        try:
            payload = resp.json()
        except ValueError:
            payload = resp.text
        if resp.status_code >= 400:
            detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
            extra = payload.get("errors") if isinstance(payload, dict) else None
            lines = [f"{resp.status_code} {resp.reason}: {detail}"]
            lines += [
                e["text"] if isinstance(e, dict) and "text" in e else str(e) for e in extra or []
            ]
            raise click.ClickException("\n".join(lines))
        return payload

    def close(self) -> None:
        self.session.close()


def api_options(func: F) -> F:
    """Adds --url, --token, --ca-file, --insecure and --json to a command."""
    options = [
        click.option(
            "--url",
            envvar="GPUOPS_URL",
            default=DEFAULT_URL,
            show_default=True,
            help="Base URL of the engine API (env GPUOPS_URL).",
        ),
        click.option(
            "--token",
            envvar="GPUOPS_TOKEN",
            default=None,
            help="Bearer token (env GPUOPS_TOKEN; prefer the variable: options show in ps).",
        ),
        click.option(
            "--ca-file",
            envvar="GPUOPS_CA_FILE",
            type=click.Path(exists=True, dir_okay=False),
            default=None,
            help="CA bundle to verify the API's TLS certificate (env GPUOPS_CA_FILE).",
        ),
        click.option("--insecure", is_flag=True, help="Do not verify the TLS certificate."),
        click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def client(url: str, token: str | None, ca_file: str | None, insecure: bool) -> ApiClient:
    return ApiClient(url, token, ca_file, insecure)


def remote_call(options: dict[str, Any], method: str, path: str, **request: Any) -> Any:
    """One call with the connection options ``api_options`` put into ``options`` (removed)."""
    api = client(
        options.pop("url"), options.pop("token"), options.pop("ca_file"), options.pop("insecure")
    )
    try:
        return api.call(method, path, **request)
    finally:
        api.close()


def when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def show(
    payload: Any,
    as_json: bool,
    rows: Sequence[Mapping[str, Any]] | None = None,
    columns: Sequence[tuple[str, Callable[[Mapping[str, Any]], Any]]] = (),
) -> None:
    """Print ``payload`` as JSON, or ``rows`` as a table of ``columns`` (title, getter)."""
    if as_json:
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
        return
    if rows is None:
        for key, value in payload.items():
            click.echo(
                f"{key}: {value if not isinstance(value, dict | list) else json.dumps(value)}"
            )
        return
    cells = [[str(get(row)) for _, get in columns] for row in rows]
    titles = [title for title, _ in columns]
    widths = [max([len(t)] + [len(c[i]) for c in cells]) for i, t in enumerate(titles)]
    click.echo("  ".join(t.upper().ljust(w) for t, w in zip(titles, widths, strict=True)).rstrip())
    for row_cells in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row_cells, widths, strict=True)).rstrip())
    if not cells:
        click.echo("(none)", err=True)


def _why(exc: requests.RequestException) -> str:
    """What went wrong with a request, in a few words rather than urllib3's nested repr."""
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS failed (a certificate the client does not trust? --ca-file)"
    if isinstance(exc, requests.exceptions.ConnectTimeout | requests.exceptions.ReadTimeout):
        return "it did not answer in time"
    if isinstance(exc, requests.exceptions.ConnectionError):
        text = str(exc)
        for errno_text in ("Connection refused", "Name or service not known", "No route to host"):
            if errno_text in text:
                return errno_text.lower()
        return "the connection failed"
    return type(exc).__name__
