"""``gpuops audit search|anomalies``: read the audit trail.

A thin front over ``gpuops.audit.search`` and ``gpuops.audit.anomalies``: against Elasticsearch
when ``--url`` / ``GPUOPS_ELASTICSEARCH_URL`` is given, else against the local spool
(``--spool-dir``), with the same results. Output: a table, or JSON lines with ``--json``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from gpuops.audit import AuditSettings, ElasticsearchError
from gpuops.audit.anomalies import AnomalySettings, find_anomalies
from gpuops.audit.client import make_client
from gpuops.audit.query import get_field, parse_time
from gpuops.audit.search import Backend, ElasticsearchBackend, SearchQuery, SpoolBackend

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, now: float) -> float:
    """``30m``, ``2h``, ``7d`` (that long ago), ``now``, or an ISO 8601 time (UTC if naive)."""
    if text == "now":
        return now
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    ts = parse_time(text if re.search(r"(Z|[+-]\d\d:?\d\d)$", text) else text + "+00:00")
    if ts is None:
        raise click.BadParameter(f"{text!r}: expected a duration (30m, 2h, 7d), 'now' or ISO time")
    return ts


_URL = click.option(
    "--url",
    envvar="GPUOPS_ELASTICSEARCH_URL",
    help="Elasticsearch URL; without it the local spool is searched. "
    "Env: GPUOPS_ELASTICSEARCH_URL (API key: GPUOPS_ELASTICSEARCH_API_KEY).",
)
_SPOOL = click.option(
    "--spool-dir",
    envvar="GPUOPS_AUDIT_SPOOL_DIR",
    default="var/audit",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Audit spool directory read when no Elasticsearch URL is given. "
    "Env: GPUOPS_AUDIT_SPOOL_DIR.",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document per line.")
_UNTIL = click.option(
    "--until", default="now", show_default=True, help="End of the time range (same forms)."
)


@contextmanager
def open_backend(url: str | None, spool_dir: Path) -> Iterator[Backend]:
    """The Elasticsearch backend for ``url``, or the spool backend of ``spool_dir``."""
    if not url:
        if not spool_dir.is_dir():
            raise click.ClickException(f"no audit spool at {spool_dir} (and no --url given)")
        yield SpoolBackend(spool_dir)
        return
    settings = AuditSettings(
        spool_dir=spool_dir,
        elasticsearch_url=url,
        elasticsearch_api_key=os.environ.get("GPUOPS_ELASTICSEARCH_API_KEY"),
    )
    client = make_client(settings)
    try:
        yield ElasticsearchBackend(client)
    except ElasticsearchError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()


@click.group(name="audit")
def audit() -> None:
    """Search the audit trail of decisions and user operations, and find anomalies in it."""


def _first(doc: Mapping[str, Any], path: str) -> str:
    values = get_field(doc, path)
    return ",".join(str(v) for v in values) if values else "-"


@audit.command("search")
@_URL
@_SPOOL
@click.option("--since", default="24h", show_default=True, help="Start: 30m, 2h, 7d ago or ISO.")
@_UNTIL
@click.option("--user", help="user.name of a user operation.")
@click.option("--policy", help="rule.name: the policy of a decision.")
@click.option(
    "--action",
    help="event.action: a decision's verb (reclaim, downclock, scale_out...) or an API "
    "operation (grant_approval, deny_approval, set_kill_switch, authenticate...).",
)
@click.option(
    "--outcome", type=click.Choice(["success", "failure", "unknown"]), help="event.outcome."
)
@click.option("--label", "labels", multiple=True, help="Target label NAME=VALUE (repeatable).")
@click.option("--text", help="Free text: every word must be in the message.")
@click.option(
    "--stream",
    type=click.Choice(["all", "decision", "audit"]),
    default="all",
    show_default=True,
    help="Decisions, user operations, or both.",
)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Most documents shown.",
)
@_JSON
def search(
    url: str | None,
    spool_dir: Path,
    since: str,
    until: str,
    user: str | None,
    policy: str | None,
    action: str | None,
    outcome: str | None,
    labels: tuple[str, ...],
    text: str | None,
    stream: str,
    limit: int,
    as_json: bool,
) -> None:
    """Find audit documents, newest first."""
    now = time.time()
    pairs: dict[str, str] = {}
    for item in labels:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--label")
        pairs[name] = value
    query = SearchQuery(
        since=parse_when(since, now),
        until=parse_when(until, now),
        user=user,
        policy=policy,
        action=action,
        outcome=outcome,
        labels=pairs,
        text=text,
        stream=stream,  # type: ignore[arg-type]
        limit=limit,
    )
    with open_backend(url, spool_dir) as backend:
        docs = backend.search(query)
    if as_json:
        for doc in docs:
            click.echo(json.dumps(doc, sort_keys=True))
        return
    click.echo(f"{'@timestamp':24} {'action':18} {'outcome':8} {'who':24} message")
    for doc in docs:
        who = _first(doc, "user.name") if get_field(doc, "user.name") else _first(doc, "rule.name")
        click.echo(
            f"{_first(doc, '@timestamp'):24} {_first(doc, 'event.action'):18} "
            f"{_first(doc, 'event.outcome'):8} {who:24} {_first(doc, 'message')}"
        )
    click.echo(f"{len(docs)} document{'s' if len(docs) != 1 else ''}", err=True)


@audit.command("anomalies")
@_URL
@_SPOOL
@click.option("--since", default="24h", show_default=True, help="Start: 30m, 2h, 7d ago or ISO.")
@_UNTIL
@click.option("--flap-min", default=3, show_default=True, help="Episodes per policy/target.")
@click.option("--repeat-min", default=3, show_default=True, help="Executed actions per target.")
@click.option("--node-failures-min", default=3, show_default=True, help="Failures per node.")
@click.option("--oom-min", default=2, show_default=True, help="GPU out-of-memory events per job.")
@click.option("--user-min-ops", default=20, show_default=True, help="Ops in the last hour.")
@click.option("--user-factor", default=3.0, show_default=True, help="× the user's hourly mean.")
@click.option(
    "--user-min-history",
    default=3,
    show_default=True,
    help="A user's ops 6h or more before the last hour needed to compare with (no history: "
    "not flagged).",
)
@_JSON
def anomalies(
    url: str | None,
    spool_dir: Path,
    since: str,
    until: str,
    flap_min: int,
    repeat_min: int,
    node_failures_min: int,
    oom_min: int,
    user_min_ops: int,
    user_factor: float,
    user_min_history: int,
    as_json: bool,
) -> None:
    """Flapping policies, targets acted on repeatedly, actions failing on one node, jobs
    failing with GPU out-of-memory, unusual operation counts per user. Exit 0 either way."""
    now = time.time()
    settings = AnomalySettings(
        since=parse_when(since, now),
        until=parse_when(until, now),
        flap_min_episodes=flap_min,
        repeat_min_actions=repeat_min,
        node_min_failures=node_failures_min,
        oom_min_failures=oom_min,
        user_min_ops=user_min_ops,
        user_factor=user_factor,
        user_min_history_ops=user_min_history,
    )
    with open_backend(url, spool_dir) as backend:
        findings = find_anomalies(backend, settings)
    if as_json:
        for finding in findings:
            click.echo(json.dumps(asdict(finding), sort_keys=True))
        return
    for finding in findings:
        click.echo(f"{finding.check:24} {finding.count:6}  {finding.message}")
    click.echo(f"{len(findings)} finding{'s' if len(findings) != 1 else ''}", err=True)


@audit.command("slurm-jobs")
@click.option(
    "--spool-dir",
    default="var/audit-slurm-jobs",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Audit spool the job events go to (its own: a spool has one writer; with --url "
    "they reach the same Elasticsearch as the engine's).",
)
@click.option(
    "--url",
    envvar="GPUOPS_ELASTICSEARCH_URL",
    help="Elasticsearch URL to ship the events to. Env: GPUOPS_ELASTICSEARCH_URL.",
)
@click.option(
    "--slurm-conf",
    envvar="SLURM_CONF",
    type=click.Path(exists=True, dir_okay=False),
    help="slurm.conf of the cluster (default: Slurm's own). Env: SLURM_CONF.",
)
@click.option(
    "--interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    help="Seconds between looks at slurmctld (shorter than MinJobAge and than cred_expire, "
    "so that every requeued run is seen).",
)
@click.option("--once", is_flag=True, help="Look once and exit (cron, tests).")
def slurm_jobs(
    spool_dir: Path, url: str | None, slurm_conf: str | None, interval: float, once: bool
) -> None:
    """Write every ended Slurm job run as an ECS event (exit state, GPU out-of-memory found in
    the job's output) for `gpuops audit anomalies` and Kibana."""
    import socket
    import threading

    from gpuops.audit import AuditLog
    from gpuops.audit.jobs import SlurmJobWatcher
    from gpuops.integrations.slurm.client import SlurmClient, SlurmError

    settings = AuditSettings(spool_dir=spool_dir, elasticsearch_url=url)
    stop = threading.Event()
    with AuditLog(settings, host_name=socket.gethostname()) as audit_log:
        watcher = SlurmJobWatcher(
            SlurmClient(conf=slurm_conf), audit_log.record, socket.gethostname()
        )
        while True:
            try:
                written = watcher.poll()
            except SlurmError as exc:
                click.echo(f"Slurm unreachable: {exc}", err=True)
            else:
                for doc_id in written:
                    click.echo(f"job event {doc_id}")
            if once or stop.wait(interval):
                return
