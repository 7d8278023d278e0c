"""``gpuops rules check|export|test``: validate, export and unit-test policy files; and
``gpuops rules list|show|reload|validate-remote`` against a running engine's API.

A thin front over ``gpuops.model.rules.loader`` (schema), ``gpuops.offline.promtool`` (promtool),
``gpuops.model.rules.export`` (Prometheus rule file) and ``gpuops.offline.policytest`` (policy unit
tests).
Problems are printed one per line as ``FILE:LINE: message``; exit 0 when all is well, 1 when not.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from gpuops.actions.registry import ExecutorRegistry
from gpuops.cli.api_client import api_options, remote_call, show, when
from gpuops.model.rules.export import export_rules
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import RuleError, RulesError, RuleSet
from gpuops.offline.promtool import PromtoolError

_PATHS = click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _report(errors: list[RuleError]) -> None:
    for error in errors:
        click.echo(str(error))
    files = len({e.file for e in errors})
    click.echo(f"{_count(len(errors), 'error')} in {_count(files, 'file')}", err=True)


def _load(paths: tuple[Path, ...]) -> RuleSet:
    try:
        return load_rules(paths)
    except RulesError as exc:
        _report(exc.errors)
        sys.exit(1)


@click.group(name="rules")
def rules() -> None:
    """Check, export and unit-test policy files (rules/*.yaml)."""


@rules.command("check")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--no-promql",
    is_flag=True,
    help="Skip the PromQL check by promtool (for machines without promtool).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Engine configuration: check its rules (when no PATHS are given) as that engine "
    "loads them.",
)
def check(paths: tuple[Path, ...], no_promql: bool, config_path: Path | None) -> None:
    """Validate policy files or directories exactly as the engine does when it loads them
    (schema, PromQL, each action's executor, verb and params); print every problem as
    FILE:LINE: message."""
    from gpuops.offline.rulecheck import load_checked
    from gpuops.settings import ConfigError, load_config

    targets: list[Path] = list(paths)
    if config_path is not None:
        try:
            config = load_config(config_path)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        targets = targets or list(config.rules)
        kubeconfig = _kubeconfig_problem(config.executors)
        if kubeconfig is not None:
            raise click.ClickException(f"{config_path}: executors.kubernetes: {kubeconfig}")
    if not targets:
        raise click.UsageError("give rule files or directories, or --config ENGINE_YAML")
    # the engine's registry: the executors installed (entry points), as `engine run` builds it
    registry = ExecutorRegistry.from_entry_points()
    if config_path is not None:
        # each configured executor built as the engine builds it at its start (nothing
        # is run), so that a mistake in its settings is found before the engine starts
        problems = _executor_problems(registry, config.executors)
        if problems:
            raise click.ClickException("\n".join(f"{config_path}: {why}" for why in problems))
    try:
        ruleset = load_checked(targets, registry, check_promql=not no_promql)
    except RulesError as exc:
        _report(exc.errors)
        sys.exit(1)
    except PromtoolError as exc:
        raise click.ClickException(str(exc)) from None
    count = sum(1 for _ in ruleset.policies())
    checked = "schema, executors" if no_promql else "schema, PromQL, executors"
    click.echo(
        f"OK: {count} {'policy' if count == 1 else 'policies'} in "
        f"{_count(len(ruleset.groups), 'group')} from {_count(len(ruleset.files), 'file')} "
        f"({checked} checked)"
    )


@rules.command("export")
@_PATHS
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the Prometheus rule file here instead of to standard output.",
)
def export(paths: tuple[Path, ...], output: Path | None) -> None:
    """Write the policies as a plain Prometheus rule file of alerting rules."""
    text = export_rules(_load(paths))
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)


@rules.command("test")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--prometheus-timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the test Prometheus to start.",
)
def test(files: tuple[Path, ...], prometheus_timeout: float) -> None:
    """Run policy unit tests: input series, expected decisions, PromQL by a real Prometheus."""
    from gpuops.offline.policytest import (
        run_test_files,  # starts processes: imported only when used
    )

    ok = run_test_files(list(files), echo=click.echo, start_timeout=prometheus_timeout)
    sys.exit(0 if ok else 1)


# --- against a running engine (its REST API) ---------------------------------------------------


@rules.command("list")
@api_options
def listremote_call(as_json: bool, **kw: Any) -> None:
    """The policies a running engine has loaded."""
    payload = remote_call(kw, "GET", "/rules")
    columns = (
        ("policy", lambda p: p["name"]),
        ("group", lambda p: p["group"]),
        ("mode", lambda p: p["mode"]),
        ("action", lambda p: f"{p['action']['type']}@{p['action']['executor']}"),
        ("source", lambda p: p["source"]),
    )
    show(payload, as_json, payload["policies"], columns)


@rules.command("show")
@click.argument("name")
@api_options
def showremote_call(name: str, as_json: bool, **kw: Any) -> None:
    """One policy of a running engine, every setting."""
    show(remote_call(kw, "GET", f"/rules/{name}"), as_json)


@rules.command("targets")
@click.argument("name")
@click.option(
    "--limit",
    type=click.IntRange(0, 1000),
    default=50,
    show_default=True,
    help="Targets shown (pending first).",
)
@api_options
def targets_remote(name: str, limit: int, as_json: bool, **kw: Any) -> None:
    """Why a policy of a running engine has not acted: its targets pending or firing now, and
    when each may act next (its for, cooldown, max_per_hour, repeat_interval, a hold)."""
    payload = remote_call(kw, "GET", f"/rules/{name}/targets", params={"limit": limit})
    columns = (
        ("target", lambda t: t["key"]),
        ("state", lambda t: t["status"]),
        ("since", lambda t: when(t["since"])),
        ("may act", lambda t: "after it clears" if t["next_at"] is None else when(t["next_at"])),
        ("waits for", lambda t: t["waits_for"]),
    )
    show(payload, as_json, payload["targets"], columns)
    if not as_json and payload["total"] > len(payload["targets"]):
        click.echo(f"{payload['total']} targets in all; --limit shows more", err=True)


@rules.command("reload")
@api_options
def reloadremote_call(as_json: bool, **kw: Any) -> None:
    """Make a running engine read its rule files again (admin); errors keep the old rules."""
    show(remote_call(kw, "POST", "/rules/reload"), as_json)


@rules.command("validate-remote")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--promql", is_flag=True, help="Also have the engine check PromQL with promtool.")
@api_options
def validateremote_call(file: Path, promql: bool, as_json: bool, **kw: Any) -> None:
    """Have a running engine validate FILE; problems print as FILE:LINE: message."""
    payload = remote_call(
        kw,
        "POST",
        "/rules/validate",
        params={"filename": file.name, "promql": str(promql).lower()},
        text=file.read_text(encoding="utf-8"),
    )
    if as_json:
        show(payload, True)
    else:
        for error in payload["errors"]:
            click.echo(error["text"])
        click.echo("OK" if payload["ok"] else f"{_count(len(payload['errors']), 'error')}")
    sys.exit(0 if payload["ok"] else 1)


def _executor_problems(
    registry: ExecutorRegistry, executors: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Why each configured executor that cannot be built from its settings cannot, once each
    (a logical executor fails with the concrete one it maps to), naming ``executors.NAME``."""
    problems: list[str] = []
    for name, settings in executors.items():
        try:
            registry.create(name, settings)
        except OSError as exc:  # a file only the engine's host has (a token): said, not refused
            said = str(exc) if str(exc).startswith("executors.") else f"executors.{name}: {exc}"
            click.echo(
                f"note: {said} (not readable here; the engine refuses to start where it cannot "
                "read it)",
                err=True,
            )
        except Exception as exc:  # any executor's own settings error, as its action would say
            why = str(exc).strip() or type(exc).__name__
            why = why if why.startswith("executors.") else f"executors.{name}: {why}"
            if why not in problems:
                problems.append(why)
    return problems


def _kubeconfig_problem(executors: Mapping[str, Mapping[str, Any]]) -> str | None:
    """What is wrong with the kubeconfig of the ``kubernetes`` executor, when one is set:
    missing or unreadable (its first action would fail on it)."""
    settings = executors.get("kubernetes") or {}
    if settings.get("in_cluster") or not settings.get("kubeconfig"):
        return None
    from gpuops.integrations.kubernetes.client import (
        check_kubeconfig,
    )  # the client is slow to import

    timeout = settings.get("exec_timeout_s")
    if isinstance(timeout, int | float) and timeout > 0:
        return check_kubeconfig(str(settings["kubeconfig"]), float(timeout))
    return check_kubeconfig(str(settings["kubeconfig"]))
