"""``gpuops health check|xids|nodes|clear``: check XID override files, show the XID catalogue
in force, list the remediation ladder's nodes and clear one that needs a human (the last two
through the engine's API: ``gpuops.cli.api_client``).

The first two are a thin front over ``gpuops.model.health.catalogue_file``. Problems are
printed one per line as ``FILE:LINE: message``, as ``gpuops rules check`` prints them; exit 0
when all is well, 1 when not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from gpuops.cli.api_client import api_options, remote_call, show, when
from gpuops.model.health.catalogue import XidCatalogue
from gpuops.model.health.catalogue_file import load_catalogue
from gpuops.model.rules.durations import format_duration
from gpuops.model.rules.model import RulesError

_CONFIG = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Engine configuration: use its health.xid_overrides (when no FILES are given).",
)


def _overrides(files: tuple[Path, ...], config_path: Path | None) -> list[Path]:
    if files or config_path is None:
        return list(files)
    from gpuops.settings import ConfigError, load_config

    try:
        return list(load_config(config_path).health.xid_overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _catalogue(files: list[Path]) -> XidCatalogue:
    try:
        return load_catalogue(files)
    except RulesError as exc:
        for error in exc.errors:
            click.echo(str(error))
        count = len(exc.errors)
        click.echo(f"{count} error{'s' if count != 1 else ''}", err=True)
        sys.exit(1)


@click.group(name="health")
def health() -> None:
    """GPU health: the XID catalogue and its site overrides (docs/health.md)."""


@health.command("check")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@_CONFIG
def check(files: tuple[Path, ...], config_path: Path | None) -> None:
    """Check XID override files as the engine reads them (known codes, classes and actions,
    thresholds, cancels); print every problem as FILE:LINE: message."""
    paths = _overrides(files, config_path)
    if not paths:
        raise click.UsageError("give XID override files, or --config ENGINE_YAML")
    catalogue = _catalogue(paths)
    changed = len(paths)
    click.echo(
        f"OK: {changed} override file{'s' if changed != 1 else ''} over the {len(catalogue)} "
        f"codes of {catalogue.source}"
    )


@health.command("xids")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@_CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON lines.")
def xids(files: tuple[Path, ...], config_path: Path | None, as_json: bool) -> None:
    """Print the XID catalogue in force: the shipped one with FILES (or the configuration's
    overrides) applied."""
    catalogue = _catalogue(_overrides(files, config_path))
    for e in catalogue:
        threshold = (
            f"{e.threshold.count} in {format_duration(e.threshold.window_s)}"
            if e.threshold is not None
            else "-"
        )
        if as_json:
            doc = {
                "code": e.code,
                "mnemonic": e.mnemonic,
                "class": e.xid_class.value,
                "action": e.action.value,
                "threshold": None
                if e.threshold is None
                else {"count": e.threshold.count, "window_s": e.threshold.window_s},
                "cancels": list(e.cancels),
                "nvidia": e.nvidia,
            }
            click.echo(json.dumps(doc))
        else:
            cancels = f" cancels {','.join(map(str, e.cancels))}" if e.cancels else ""
            click.echo(
                f"{e.code:>4}  {e.xid_class.value:<11} {e.action.value:<11} {threshold:<12} "
                f"{e.mnemonic}{cancels}"
            )
    if not as_json:
        applied = ", ".join(catalogue.overridden_by) or "no overrides"
        click.echo(f"{len(catalogue)} codes from {catalogue.source}; {applied}", err=True)


_NODE_COLUMNS = (
    ("node", lambda r: r["node"]),
    ("stage", lambda r: r["stage"]),
    ("since", lambda r: when(r["since"])),
    ("gpu", lambda r: r["gpu"] or "-"),
    ("domains", lambda r: ", ".join(r.get("domains") or []) or "-"),
    ("fault", lambda r: r["fault"] or "-"),
    ("done", lambda r: ", ".join(r["done"]) or "-"),
    ("why", lambda r: r["why"] or "-"),
)


@health.command("nodes")
@api_options
def nodes(as_json: bool, **kw: Any) -> None:
    """The nodes on the remediation ladder and their stage (quarantined, remediating,
    validating, returned, needs_human)."""
    payload = remote_call(kw, "GET", "/health/nodes")
    show(payload, as_json, payload, _NODE_COLUMNS)


@health.command("clear")
@click.argument("node")
@api_options
def clear(node: str, as_json: bool, **kw: Any) -> None:
    """Clear NODE, which needs a human: its next fault may be remediated again (admin). It
    stays drained: return it to service yourself."""
    payload = remote_call(kw, "POST", f"/health/nodes/{quote(node, safe='')}/clear")
    show(payload, as_json, [payload], _NODE_COLUMNS)
