"""`gpuops state`: check the engine's state (the SQLite file or PostgreSQL) and reset the file
(docs/state.md).

The engine never resets a state file it cannot trust; ``gpuops state reset`` does, explicitly:
it keeps the old file aside (renamed, never deleted) and audits the reset as a CLI operation in
the engine's audit spool. It refuses while an engine runs (the spool's writer lock is held).
"""

from __future__ import annotations

import dataclasses
import getpass
import socket
import time
from pathlib import Path
from urllib.parse import quote

import click

from gpuops.audit import AuditLog
from gpuops.audit.errors import SpoolLockedError
from gpuops.runtime.backend import previous_run
from gpuops.settings import ConfigError, EngineConfig, load_config
from gpuops.store.errors import StateError
from gpuops.store.postgres import PostgresStore
from gpuops.store.postgres.connection import Credentials, redacted
from gpuops.store.sqlite import StateStore
from gpuops.store.sqlite.integrity import reset

_CONFIG = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Engine configuration (YAML) that names the state file and the audit spool.",
)


@click.group(name="state")
def state() -> None:
    """Check and reset the engine's state file."""


def _config(path: Path, *, database: bool = False) -> EngineConfig:
    """The configuration; ``database``: whether the command also works on PostgreSQL."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if config.state.url is not None and not database:
        raise click.ClickException(
            f"{path}: the state is in PostgreSQL (state.url); gpuops state reset works on the"
            " SQLite state file only: the replicas share the database (docs/ha.md)"
        )
    return config


def _open(config: EngineConfig) -> StateStore | PostgresStore:
    """The store the engine would open; on PostgreSQL a read-only session that neither
    creates nor migrates the schema."""
    state = config.state
    if state.url is None:
        return StateStore(config.state_file, previous_run(config))
    credentials = Credentials(state.password_file, state.password_env)
    return PostgresStore(state.url, credentials, "gpuops-state-check", state.lease, read_only=True)


def _problem(config: EngineConfig) -> str | None:
    """Why the state cannot be used, or None when it can: the checks at open, then every row
    the engine reads at start or per policy, and the stored alerts (the inbox, the resolves
    that came early) it cannot decode or handles as resolved."""
    try:
        store = _open(config)
    except StateError as exc:
        return str(exc)
    problems: list[str] = []
    try:
        for read in (store.guardrail_state, store.unaudited, store.unfinished):
            try:
                read()
            except StateError as exc:
                problems.append(str(exc))
        for policy in store.policy_names():
            try:
                store.policy_state(policy)
            except StateError as exc:
                problems.append(str(exc))
        problems.extend(store.alert_row_problems())
    finally:
        store.close()
    return "\n".join(problems) or None


@state.command(name="check")
@_CONFIG
def check(config_path: Path) -> None:
    """Open the state (the file, or PostgreSQL with state.url) as the engine does and read
    every row it reads; exit 1 with what is wrong. Changes no row."""
    config = _config(config_path, database=True)
    problem = _problem(config)
    if problem is not None:
        raise click.ClickException(problem)
    where = config.state_file if config.state.url is None else redacted(config.state.url)
    click.echo(f"{where}: OK")


@state.command(name="reset")
@_CONFIG
@click.option(
    "--policy",
    default=None,
    help="Reset only this policy's stored state (a bad row); the rest of the file stays.",
)
def reset_cmd(config_path: Path, policy: str | None) -> None:
    """Start afresh: keep the state file aside as NAME.broken-TIMESTAMP and make a new one (a
    missing file: make a new one), or (--policy) keep one policy's row aside as a file and
    remove it. Audited; stop the engine first. A reset forgets cooldowns, firing targets and
    pending approvals of what it resets."""
    config = _config(config_path)
    path = config.state_file
    problem = _problem(config) if policy is None else None
    # the spool's limits from the config; nothing is shipped from here (the engine ships it)
    settings = dataclasses.replace(config.audit.settings(), elasticsearch_url=None)
    try:
        audit = AuditLog(settings, host_name=socket.gethostname())
    except SpoolLockedError as exc:
        raise click.ClickException(f"{exc}: stop the engine before resetting its state") from None
    action = "state.reset" if policy is None else "state.reset_policy"
    details: dict[str, str] = {"state_file": str(path)}
    try:
        if policy is None:
            details["problem"] = problem or "none (the file was readable)"
            aside = reset(path)
            StateStore(path).close()
            message = f"state file {path} reset"
            if aside is not None:
                details["kept_as"] = str(aside)
                message += f"; the old one kept as {aside}"
            else:
                message += "; there was no file to keep aside, a new one was made"
        else:
            details["policy"] = policy
            message = _reset_policy(path, policy, details)
    except (StateError, OSError) as exc:
        user, error = getpass.getuser(), str(exc)
        audit.operation(user, (), action, "failure", None, f"{action} failed", details, error)
        audit.close()
        raise click.ClickException(error) from None
    audit.operation(getpass.getuser(), (), action, "success", None, message, details)
    audit.close()
    click.echo(message)


def _reset_policy(path: Path, policy: str, details: dict[str, str]) -> str:
    """Keep ``policy``'s row aside as a file, then remove it from the state file."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.policy-{quote(policy, safe='')}.broken-{stamp}")
    store = StateStore(path)
    try:
        found = store.take_policy_state(policy, lambda raw: aside.write_text(raw, "utf-8"))
    finally:
        store.close()
    if not found:
        return f"{path}: no stored state of policy {policy!r}; nothing reset"
    details["kept_as"] = str(aside)
    return f"{path}: stored state of policy {policy!r} reset; the old row kept as {aside}"
