"""``gpuops decisions|approvals|quota|control|token``: operations on a running engine through
its REST API (``gpuops.cli.api_client``), with table output or ``--json``.

``gpuops token new`` makes a token and a tokens file (or an entry added to one) holding only
its SHA-256.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from gpuops.api.tokens import ROLE_PERMISSIONS, TokensError, add_user, hash_token
from gpuops.cli.api_client import api_options, remote_call, show, when
from gpuops.model.decisions import Verdict
from gpuops.model.rules.durations import format_duration, parse_duration
from gpuops.model.telling import verdict_words

_DECISION_COLUMNS = (
    ("at", lambda d: when(d.get("at"))),
    ("id", lambda d: d["id"]),
    ("policy", lambda d: d["policy"]),
    ("transition", lambda d: d["transition"]),
    ("target", lambda d: d["target"]["key"]),
    ("action", lambda d: _action(d)),
    ("verdict", lambda d: _verdict(d)),
    ("state", lambda d: d.get("state") or (d.get("outcome") or {}).get("status", "-")),
    ("effect", lambda d: d.get("effect") or "-"),
)


def _verdict(d: Mapping[str, Any]) -> str:
    """The guardrails' verdict as the console and ``explain`` say it (``runs``, ``held by the
    cooldown``); ``--json`` keeps the token (``execute``, ``suppressed:cooldown``)."""
    try:
        return verdict_words(Verdict(d["verdict"]), "")
    except ValueError:  # a verdict of an engine newer than this CLI: as it came
        return str(d["verdict"])


def _action(d: Mapping[str, Any]) -> str:
    action = d.get("action")
    if not action:
        return "-"
    return action["type"] if d.get("transition") == "fire" else f"undo: {action['type']}"


@click.group(name="decisions")
def decisions() -> None:
    """Query and explain the engine's decisions."""


@decisions.command("list")
@click.option("--policy", default=None, help="Only this policy.")
@click.option("--verdict", default=None, help="execute, dry_run, suppressed[:reason], ...")
@click.option(
    "--transition",
    type=click.Choice(["fire", "clear", "resolve"]),
    default=None,
    help="Only decisions of this transition.",
)
@click.option("--target", default=None, help="Substring of the target key (node=gpu-3).")
@click.option("--since", default=None, help="Only the last DURATION (Prometheus syntax: 1h).")
@click.option("--limit", type=int, default=50, show_default=True, help="Most decisions shown.")
@api_options
def list_decisions(
    policy: str | None,
    verdict: str | None,
    transition: str | None,
    target: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
    **kw: Any,
) -> None:
    """Decisions, newest first."""
    start = time.time() - parse_duration(since) if since else None
    params = {"policy": policy, "verdict": verdict, "transition": transition, "target": target}
    payload = remote_call(
        kw, "GET", "/decisions", params={**params, "since": start, "limit": limit}
    )
    show(payload, as_json, payload["decisions"], _DECISION_COLUMNS)


@decisions.command("explain")
@click.argument("decision_id")
@api_options
def explain(decision_id: str, as_json: bool, **kw: Any) -> None:
    """Why a decision was taken: policy, expression, evidence, guardrail verdict."""
    payload = remote_call(kw, "GET", f"/decisions/{decision_id}/explain")
    if as_json:
        show(payload, True)
        return
    if payload.get("summary"):
        click.echo(payload["summary"])
    for line in payload["explanation"]:
        click.echo(line)
    click.echo("expression:")
    for line in payload.get("expr_lines") or [payload["expr"]]:
        click.echo(f"  {line}")
    for line in payload.get("effect") or []:
        click.echo(f"changed: {line}")


@click.group(name="approvals")
def approvals() -> None:
    """List, grant and deny decisions waiting for approval."""


@approvals.command("list")
@click.option(
    "--status",
    type=click.Choice(["pending", "granted", "denied", "expired"]),
    default=None,
    help="Only approvals in this status.",
)
@api_options
def list_approvals(status: str | None, as_json: bool, **kw: Any) -> None:
    """Approvals, newest first."""
    payload = remote_call(kw, "GET", "/approvals", params={"status": status})
    columns = (
        ("decision", lambda a: a["decision_id"]),
        ("policy", lambda a: a["policy"]),
        ("target", lambda a: a["target"]),
        ("status", lambda a: a["status"]),
        ("expires", lambda a: when(a["expires_at"])),
        ("by", lambda a: a.get("decided_by") or "-"),
    )
    show(payload, as_json, payload["approvals"], columns)


def _reason_option(verb: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option(
        "--reason",
        required=True,
        callback=_said,
        help=f"Why you {verb} it (audited with your name, as the console asks).",
    )


def _said(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.strip():
        raise click.BadParameter("say why: the reason is audited with your name", ctx, param)
    return value.strip()


@approvals.command("grant")
@click.argument("decision_id")
@_reason_option("grant")
@api_options
def grant(decision_id: str, reason: str, as_json: bool, **kw: Any) -> None:
    """Run a decision waiting for approval (admin)."""
    body = {"reason": reason}
    payload = remote_call(kw, "POST", f"/approvals/{decision_id}/grant", json_body=body)
    show(payload, as_json, [payload], _DECISION_COLUMNS)


@approvals.command("deny")
@click.argument("decision_id")
@_reason_option("deny")
@api_options
def deny(decision_id: str, reason: str, as_json: bool, **kw: Any) -> None:
    """Refuse a decision waiting for approval (admin)."""
    body = {"reason": reason}
    payload = remote_call(kw, "POST", f"/approvals/{decision_id}/deny", json_body=body)
    show(payload, as_json, [payload], _DECISION_COLUMNS)


_QUOTA_COLUMNS = (
    ("id", lambda r: r["id"]),
    ("project", lambda r: r["project"]),
    ("gpus", lambda r: r["gpus"]),
    ("duration", lambda r: format_duration(r["duration_s"])),
    ("status", lambda r: r["status"]),
    ("by", lambda r: r["requested_by"]),
    ("ends", lambda r: when(r.get("ends_at"))),
    ("error", lambda r: r.get("error") or ""),
)


@click.group(name="quota")
def quota() -> None:
    """Ask for extra GPUs for a while; approve or deny such requests."""


@quota.command("request")
@click.option("--project", required=True, help="Project the GPUs are for.")
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="Extra GPUs wanted.")
@click.option("--duration", required=True, help="How long (Prometheus syntax: 8h, 2d).")
@click.option("--reason", default="", help="Why (shown to the approver and audited).")
@api_options
def request(project: str, gpus: int, duration: str, reason: str, as_json: bool, **kw: Any) -> None:
    """File a quota request (it waits for an admin)."""
    body = {"project": project, "gpus": gpus, "duration": duration, "reason": reason}
    payload = remote_call(kw, "POST", "/quota-requests", json_body=body)
    show(payload, as_json, [payload], _QUOTA_COLUMNS)


@quota.command("list")
@click.option("--status", default=None, help="Only requests in this status (pending, active...).")
@api_options
def list_quota(status: str | None, as_json: bool, **kw: Any) -> None:
    """Quota requests, newest first."""
    payload = remote_call(kw, "GET", "/quota-requests", params={"status": status})
    show(payload, as_json, payload["requests"], _QUOTA_COLUMNS)


_PROJECT_COLUMNS = (
    ("project", lambda p: p["name"]),
    ("base", lambda p: "—" if p["base"] is None else p["base"]),
    ("granted", lambda p: p["granted"]),
    ("quota", lambda p: "—" if p["quota"] is None else p["quota"]),
    ("in use", lambda p: "unknown" if p["usage"] is None else f"{p['usage']:g}"),
    ("pending", lambda p: p["pending"]),
)


@quota.command("projects")
@api_options
def projects(as_json: bool, **kw: Any) -> None:
    """Each project's base quota, GPUs granted now, quota now, GPUs in use and pending requests."""
    payload = remote_call(kw, "GET", "/quota-projects")
    show(payload, as_json, payload["projects"], _PROJECT_COLUMNS)
    if payload.get("usage_error") and not as_json:
        click.echo(payload["usage_error"], err=True)


@quota.command("approve")
@click.argument("request_id")
@api_options
def approve(request_id: str, as_json: bool, **kw: Any) -> None:
    """Approve and apply a pending request (admin)."""
    payload = remote_call(kw, "POST", f"/quota-requests/{request_id}/approve")
    show(payload, as_json, [payload], _QUOTA_COLUMNS)


@quota.command("deny")
@click.argument("request_id")
@api_options
def deny_quota(request_id: str, as_json: bool, **kw: Any) -> None:
    """Refuse a pending request (admin)."""
    payload = remote_call(kw, "POST", f"/quota-requests/{request_id}/deny")
    show(payload, as_json, [payload], _QUOTA_COLUMNS)


@click.group(name="control")
def control() -> None:
    """Pause, resume and the kill switch of a running engine."""


def _control(kw: dict[str, Any], as_json: bool, method: str, path: str) -> None:
    show(remote_call(kw, method, path), as_json)


@control.command("status")
@api_options
def status(as_json: bool, **kw: Any) -> None:
    """Whether the engine is paused, its kill switch is on or it runs in dry-run."""
    _control(kw, as_json, "GET", "/engine")


@control.command("pause")
@api_options
def pause(as_json: bool, **kw: Any) -> None:
    """Stop acting (decisions are still taken and audited)."""
    _control(kw, as_json, "POST", "/engine/pause")


@control.command("resume")
@api_options
def resume(as_json: bool, **kw: Any) -> None:
    """Act again after a pause."""
    _control(kw, as_json, "POST", "/engine/resume")


@control.command("kill-switch")
@click.argument("state", type=click.Choice(["on", "off"]))
@api_options
def kill_switch(state: str, as_json: bool, **kw: Any) -> None:
    """Turn the kill switch on (no action runs) or off."""
    _control(kw, as_json, "POST", f"/engine/kill-switch/{state}")


@click.group(name="token")
def token() -> None:
    """API tokens."""


@token.command("new")
@click.option("--name", default=None, help="User name (as the audit names the user).")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice(sorted(ROLE_PERMISSIONS)),
    help="Role (repeatable).",
)
@click.option(
    "--tokens-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Add the user to this tokens file (made, mode 0600, when missing) and print only the "
    "token on stdout.",
)
def new_token(name: str | None, roles: tuple[str, ...], tokens_file: Path | None) -> None:
    """Make a random token for a new API user.

    Without --tokens-file the token is printed once on stderr and stdout gets a tokens file
    holding only its SHA-256 (`gpuops token new ... > tokens.yaml`). With --tokens-file the user
    is added to that file and stdout gets the token alone
    (`export GPUOPS_TOKEN=$(gpuops token new ... --tokens-file var/api-tokens.yaml)`); a running
    engine whose api.tokens_file it is takes the new user at its next request."""
    if name is None:
        raise click.UsageError(
            "Missing option '--name': the new user's name, which the audit records with each "
            "of their requests (gpuops token new --name alice --role admin --tokens-file "
            "var/api-tokens.yaml)"
        )
    value = secrets.token_urlsafe(32)
    user = {"name": name, "roles": list(roles), "token_sha256": hash_token(value)}
    if tokens_file is None:
        click.echo(f"token for {name} (store it now, it is not kept): {value}", err=True)
        click.echo(yaml.safe_dump({"users": [user]}, sort_keys=False), nl=False)
        return
    try:
        add_user(tokens_file, user)
    except TokensError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"user {name} ({', '.join(roles)}) added to {tokens_file}; a running engine with "
        "this api.tokens_file accepts the token at once (it watches the file)",
        err=True,
    )
    click.echo(value)
