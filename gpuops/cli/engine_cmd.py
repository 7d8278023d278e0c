"""`gpuops engine run`: the long-running engine process."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from wsgiref.simple_server import WSGIServer

import click
from prometheus_client import start_http_server

from gpuops.api import ApiServer, TokensError, create_app
from gpuops.api.server import ApiServerError
from gpuops.api.tokens import TokenStore
from gpuops.cli import use_json_logs
from gpuops.model.rules.model import RulesError
from gpuops.runtime import Engine, ExecutorsRefused, collect_less
from gpuops.settings import ConfigError, load_config
from gpuops.store.errors import DatabaseUnavailable, StateError, StateFileMissing

log = logging.getLogger(__name__)


@click.group(name="engine")
def engine() -> None:
    """Run and inspect the automation engine."""


@engine.command(name="run")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Engine configuration (YAML): Prometheus, rules, state file, audit, executors.",
)
@click.option("--dry-run", is_flag=True, help="Record every decision but execute nothing.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=None,
    help="Log lines as sentences (text) or JSON objects with each decision's fields (json); "
    "default: the configuration's log.format (text).",
)
def run(config_path: Path, dry_run: bool, log_format: str | None) -> None:
    """Evaluate the policies until SIGTERM or Ctrl-C; SIGHUP reloads the rules. Each decision
    recorded and each outcome is one log line (docs/operations.md)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if (log_format or config.log.format) == "json":
        use_json_logs()
    if dry_run:
        config = config.model_copy(
            update={"guardrails": config.guardrails.model_copy(update={"dry_run": True})}
        )
    collect_less()  # a long-running process holding every policy's state
    try:
        eng = Engine(config)
    except StateError as exc:  # never a silent reset: gpuops state reset does that
        raise _state_refused(exc, config_path) from None
    # the API's users, TLS files and port are checked before the engine evaluates anything
    api, users = _prepare_api(eng, config_path) if config.api.listen else (None, None)
    server = _metrics_server(eng, api, config_path) if config.metrics_listen else None
    try:
        eng.start()
    except (RulesError, StateError, ExecutorsRefused) as exc:
        eng.stop()
        if api is not None:
            api.stop()
        if server is not None:
            server.shutdown()
        if isinstance(exc, StateError):
            raise _state_refused(exc, config_path) from None
        if isinstance(exc, ExecutorsRefused):
            raise click.ClickException(
                f"{config_path}: an executor cannot be built, engine not started:\n{exc}"
            ) from None
        raise click.ClickException(f"invalid rules, engine not started:\n{exc}") from None
    if api is not None:
        _serve(eng, api)
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            log.info("SIGHUP: reloading rules%s", " and API users" if api else "")
            eng.reload()
            if users is not None:
                try:
                    users.reload()
                except TokensError as exc:
                    log.error("API users not reloaded, the current ones stay: %s", exc)
        else:
            stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    log.info(
        "engine running against %s; audit spool %s", config.prometheus.url, config.audit.spool_dir
    )
    try:
        stopping.wait()
    finally:
        log.info("stopping")
        if api is not None:
            api.stop()
        eng.stop()
        if server is not None:
            server.shutdown()


def _state_refused(exc: StateError, config_path: Path) -> click.ClickException:
    if isinstance(exc, DatabaseUnavailable):  # PostgreSQL (docs/ha.md): nothing to reset
        return click.ClickException(f"{exc}\nnothing was changed (docs/ha.md)")
    if isinstance(exc, StateFileMissing):  # nothing to keep aside
        return click.ClickException(
            f"{exc}\nnothing was changed; with this configuration: `gpuops state reset --config"
            f" {config_path}` (docs/state.md)"
        )
    return click.ClickException(
        f"{exc}\nnothing was changed; `gpuops state reset --config {config_path}` keeps it"
        " aside and starts afresh (docs/state.md)"
    )


def _metrics_server(eng: Engine, api: ApiServer | None, config_path: Path) -> WSGIServer:
    """The engine's /metrics (``metrics_listen``), serving; a port that cannot be had stops
    what was started and names the key."""
    listen = eng.config.metrics_listen
    assert listen is not None
    host, _, port = listen.rpartition(":")
    try:
        server, _thread = start_http_server(
            int(port), addr=host or "127.0.0.1", registry=eng.metrics.registry
        )
    except OSError as exc:
        eng.stop()
        if api is not None:
            api.stop()
        raise click.ClickException(
            f"engine metrics cannot listen on {listen}: {exc.strerror}; set another port in "
            f"metrics_listen of {config_path} (null: no metrics listener)"
        ) from None
    log.info("engine metrics at http://%s/metrics", listen)
    return server


def _prepare_api(eng: Engine, config_path: Path) -> tuple[ApiServer, TokenStore]:
    """The REST API (``api.listen``) with its users loaded, its TLS files checked and its port
    bound, not yet serving; returns the server and its users (reloaded on SIGHUP)."""
    settings = eng.config.api
    assert settings.listen is not None
    problem = _tls_problem(settings.tls_cert_file, settings.tls_key_file)
    try:
        if problem:
            raise ApiServerError(problem)
        app = create_app(eng, settings)
        server = ApiServer(app, settings.listen, settings.tls_cert_file, settings.tls_key_file)
        return server.bind(), app.state.api.tokens
    except (TokensError, ApiServerError) as exc:
        eng.stop()
        hint = ""
        if (
            isinstance(exc, TokensError)
            and settings.tokens_file
            and not settings.tokens_file.exists()
        ):
            hint = (
                "\nmake it: gpuops token new --name NAME --role admin "
                f"--tokens-file {settings.tokens_file}"
            )
        if isinstance(exc, ApiServerError) and "cannot listen" in str(exc):
            hint = f"\nset another port in api.listen of {config_path}"
        raise click.ClickException(f"API not started, engine stopped: {exc}{hint}") from None


def _tls_problem(cert: Path | None, key: Path | None) -> str | None:
    for name, path in (("api.tls_cert_file", cert), ("api.tls_key_file", key)):
        if path is not None and not path.is_file():
            return f"{name}: {path} is not a readable file"
    return None


def _serve(eng: Engine, api: ApiServer) -> None:
    """Serve the prepared API over TLS when a certificate is configured."""
    try:
        api.start()
    except ApiServerError as exc:
        eng.stop()
        raise click.ClickException(f"API not started, engine stopped: {exc}") from None
    if eng.config.api.console.enabled:
        log.info("web console at %s/ (sign in with an API token)", api.url)
