"""The ``gpuops`` command: a thin click front over the engine and the exporters.

Each subcommand group lives in its own module here and is registered below; a module is
imported only when its command runs (or ``--help`` lists them all), so that ``gpuops rules
validate`` does not pay for the API, the plots or the Elasticsearch client. Logging is
configured here and nowhere else. Errors reach the user as ``Type: message`` with exit code 1
(2 for usage errors, as click does).
"""

from __future__ import annotations

import json
import logging
import sys
from importlib import import_module

import click

from gpuops import __version__

# (module, attribute) of every top-level command; each module owns its group.
_COMMANDS = (
    ("gpuops.cli.engine_cmd", "engine"),
    ("gpuops.cli.fleet", "fleet"),
    ("gpuops.cli.exporter", "exporter"),
    ("gpuops.cli.rules", "rules"),
    ("gpuops.cli.health", "health"),
    ("gpuops.cli.batch", "batch"),
    ("gpuops.cli.audit", "audit"),
    ("gpuops.cli.state", "state"),
    ("gpuops.cli.elk", "elk"),
    ("gpuops.cli.demo", "demo"),
    ("gpuops.cli.backtest", "backtest"),
    ("gpuops.cli.whatif", "whatif"),
    ("gpuops.cli.remote", "decisions"),
    ("gpuops.cli.remote", "approvals"),
    ("gpuops.cli.remote", "quota"),
    ("gpuops.cli.remote", "control"),
    ("gpuops.cli.remote", "token"),
    ("gpuops.cli.reference", "reference"),
)


class _LazyGroup(click.Group):
    """A group whose ``_COMMANDS`` are imported when asked for (click's "lazily loading
    subcommands" pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *(attr for _, attr in _COMMANDS)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module, attr in _COMMANDS:
            if attr == cmd_name and cmd_name not in self.commands:
                self.add_command(getattr(import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


FIELDS = "gpuops_fields"
"""The ``LogRecord`` attribute of a line's own fields (``gpuops.runtime.gate.told.FIELDS``:
a decision's policy, target, action, verdict, state, id), written as JSON keys."""


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "@timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "log.level": record.levelname.lower(),
            "log.logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            doc.update((k, v) for k, v in fields.items() if k not in doc)
        if record.exc_info:
            doc["error.stack_trace"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def use_json_logs() -> None:
    """Write the log lines configured by ``configure_logging`` as JSON from now on."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_JsonFormatter())


def configure_logging(level: str, json_format: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # prometheus-api-client and urllib3 are chatty at INFO/DEBUG.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    # APScheduler logs every job run at INFO.
    logging.getLogger("apscheduler").setLevel(max(root.level, logging.WARNING))


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuops")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    help="Lowest level of log lines written to stderr.",
)
@click.option("--log-json", is_flag=True, help="Write log lines as JSON (ECS field names).")
def cli(log_level: str, log_json: bool) -> None:
    """gpuops: automation for GPU fleets, driven by PromQL policies."""
    configure_logging(log_level, log_json)


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # the last line of defence: a message, not a traceback
        logging.getLogger(__name__).debug("unhandled error", exc_info=True)
        click.echo(f"{type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
