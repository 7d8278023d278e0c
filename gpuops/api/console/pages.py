"""The console's pages (GET): overview, decisions, one decision explained, approvals, quota
requests, rules, audit search and its CSV/NDJSON export.

Each page needs the permission of the API route it stands for and reads through that route's
function (``gpuops.api.routes``), so the console shows what the API answers — no second copy of
the queries. Audited by ``gpuops.api.console.web.AuditedRoute`` under the API route's name.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import HTMLResponse, Response

from gpuops.api.console.web import (
    AuditedRoute,
    ConsoleDep,
    Refused,
    ViewerDep,
    grafana_link,
    kibana_link,
    need,
    render,
)
from gpuops.api.routes.audit import search_audit
from gpuops.api.routes.decisions import explain_decision, list_approvals, list_decisions
from gpuops.api.routes.quota import list_quota_projects, list_quota_requests
from gpuops.api.routes.rules import list_rules, named, rule_targets
from gpuops.api.schemas import ID_PATTERN
from gpuops.api.tokens import Permission
from gpuops.model.decisions import Outcome
from gpuops.model.readiness import duration
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import RulesError
from gpuops.model.telling import outcome_words, plural, value_in_words

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)

VERDICTS = ("execute", "dry_run", "suppressed", "awaiting_approval")
APPROVAL_STATUSES = ("pending", "granted", "denied", "expired")
OUTCOMES = ("success", "failure", "unknown")
STREAMS = ("all", "decision", "audit")


def _control(value: str | None) -> dict[str, Any] | None:
    """A control as the store keeps it (``user@epoch``), split for the page."""
    if value is None:
        return None
    user, _, at = value.rpartition("@")
    try:
        return {"by": user or value, "at": float(at)}
    except ValueError:
        return {"by": value, "at": None}


@router.get("/", name="engine_status", response_class=HTMLResponse)
def overview(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    hours: Annotated[int, Query(ge=1, le=720)] = 24,
) -> Response:
    need(viewer, Permission.ENGINE_READ, "The overview")
    engine = c.context.engine
    store = engine.store
    since = engine.clock() - hours * 3600
    by_policy: dict[str, Counter[str]] = {}
    for row in store.decisions(None, since, 10_000):
        verdict = str(row.decision.verdict).partition(":")[0]
        by_policy.setdefault(row.decision.policy, Counter())[verdict] += 1
    pending: list[Any] = []
    if viewer.can(Permission.APPROVALS_READ):
        engine.expire_approvals()
        pending = [a for a in store.approvals() if a.status == "pending"]
    requests = c.context.quota.requests() if viewer.can(Permission.QUOTA_READ) else []
    grants = [g for g in requests if g.status == "active"]
    quota_pending = [r for r in requests if r.status == "pending"]
    registry = engine.audit.registry
    audit = {
        "spool_documents": engine.audit.pending,
        "elasticsearch": bool(engine.audit.settings.elasticsearch_url),
        "last_shipped": registry.get_sample_value("gpuops_audit_last_shipped_timestamp_seconds")
        or None,
        "dropped": sum(
            s.value
            for m in registry.collect()
            if m.name == "gpuops_audit_dropped_documents"
            for s in m.samples
            if s.name.endswith("_total")
        ),
    }
    return render(
        request,
        "overview.html",
        viewer,
        hours=hours,
        kill_switch=_control(store.control("kill_switch")),
        kill_switch_file=bool(
            engine.config.guardrails.kill_switch_file
            and engine.config.guardrails.kill_switch_file.exists()
        ),
        paused=_control(store.control("paused")),
        dry_run=engine.config.guardrails.dry_run,
        policies=sum(1 for _ in engine.rules.policies()),
        by_policy=sorted(by_policy.items()),
        verdicts=VERDICTS,
        pending=pending,
        grants=grants,
        quota_pending=quota_pending,
        audit=audit,
        can_control=viewer.can(Permission.ENGINE_CONTROL),
    )


def _instant(value: str | None, what: str) -> float | None:
    """A ``YYYY-MM-DDTHH:MM`` form field (UTC) as Unix seconds."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise Refused(
            422, f"{what}: {value!r} is not a date and time (YYYY-MM-DDTHH:MM, UTC)"
        ) from None


@router.get("/decisions", name="list_decisions", response_class=HTMLResponse)
def decisions_page(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    policy: Annotated[str, Query(max_length=200)] = "",
    target: Annotated[str, Query(max_length=200)] = "",
    verdict: Annotated[str, Query(max_length=100)] = "",
    transition: Annotated[str, Query(max_length=10)] = "",
    since: Annotated[str, Query(max_length=40)] = "",
    until: Annotated[str, Query(max_length=40)] = "",
) -> Response:
    need(viewer, Permission.DECISIONS_READ, "The decisions page")
    if transition and transition not in ("fire", "clear", "resolve"):
        raise Refused(422, f"transition: {transition!r} is not one of fire, clear, resolve")
    found = list_decisions(
        c.context,
        viewer.principal,
        policy=policy or None,
        verdict=verdict or None,
        transition=transition or None,  # type: ignore[arg-type]
        target=target or None,
        since=_instant(since, "From"),
        until=_instant(until, "To"),
        limit=200,
    )
    return render(
        request,
        "decisions.html",
        viewer,
        decisions=found.decisions,
        caption=plural(len(found.decisions), "decision"),
        policies=sorted(p.name for p in c.context.engine.rules.policies()),
        verdicts=VERDICTS,
        filters={
            "policy": policy,
            "target": target,
            "verdict": verdict,
            "transition": transition,
            "since": since,
            "until": until,
        },
    )


@router.get("/decisions/{decision_id}", name="explain_decision", response_class=HTMLResponse)
def decision_page(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    decision_id: Annotated[str, Path(pattern=ID_PATTERN)],
) -> Response:
    need(viewer, Permission.DECISIONS_READ, "A decision")
    explained = explain_decision(decision_id, c.context, viewer.principal)
    stored = c.context.engine.store.decision(decision_id)
    if stored is None:  # pruned between the two reads
        raise Refused(404, f"decision {decision_id} is no longer stored")
    row = stored.decision
    target: dict[str, Any] = {"key": row.target.key, "labels": dict(row.target.labels)}
    return render(
        request,
        "decision.html",
        viewer,
        d=explained,
        row=row,
        target=target,
        grafana=grafana_link(c.settings, target["labels"]),
        kibana=kibana_link(c.settings, target["key"]),
        can_decide=viewer.can(Permission.APPROVALS_DECIDE),
        outcome=None
        if explained.outcome is None
        else outcome_words(
            Outcome(**dict(explained.outcome)), explained.action.type if explained.action else None
        ),
    )


@router.get("/approvals", name="list_approvals", response_class=HTMLResponse)
def approvals_page(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    status: Annotated[str, Query(max_length=20)] = "pending",
) -> Response:
    need(viewer, Permission.APPROVALS_READ, "The approvals page")
    if status and status not in APPROVAL_STATUSES:
        raise Refused(422, f"status: {status!r} is not one of {', '.join(APPROVAL_STATUSES)}")
    found = list_approvals(c.context, viewer.principal, status or None)  # type: ignore[arg-type]
    return render(
        request,
        "approvals.html",
        viewer,
        approvals=found.approvals,
        values={
            a.decision_id: value_in_words(a.decision.evidence.expr, a.decision.evidence.value)
            for a in found.approvals
        },
        status=status,
        statuses=APPROVAL_STATUSES,
        can_decide=viewer.can(Permission.APPROVALS_DECIDE),
    )


@router.get("/quota", name="list_quota_requests", response_class=HTMLResponse)
def quota_page(request: Request, c: ConsoleDep, viewer: ViewerDep) -> Response:
    need(viewer, Permission.QUOTA_READ, "The quota requests page")
    found = list_quota_requests(c.context, viewer.principal).requests
    projects = list_quota_projects(c.context, viewer.principal)
    settings = c.context.quota.settings
    return render(
        request,
        "quota.html",
        viewer,
        requests=found,
        active=[r for r in found if r.status == "active"],
        projects=projects.projects,
        usage_error=projects.usage_error,
        usage_asked=bool(settings.usage_query),
        settings=settings,
        can_request=viewer.can(Permission.QUOTA_REQUEST),
        can_decide=viewer.can(Permission.QUOTA_DECIDE),
    )


@router.get("/rules", name="list_rules", response_class=HTMLResponse)
def rules_page(request: Request, c: ConsoleDep, viewer: ViewerDep) -> Response:
    need(viewer, Permission.RULES_READ, "The rules page")
    engine = c.context.engine
    loaded = list_rules(c.context, viewer.principal)
    metrics = engine.metrics.registry
    policies = []
    for doc in loaded.policies:
        labels = {"group": doc.group, "policy": doc.name}
        last = engine.store.decisions(doc.name, None, 1)
        policies.append(
            {
                **doc.model_dump(),
                "expr_lines": (doc.expr or "").strip().splitlines(),
                "targets": rule_targets(doc.name, c.context, viewer.principal, RULE_TARGETS),
                "evaluations": metrics.get_sample_value("gpuops_engine_evaluations_total", labels)
                or 0,
                "last_decision": last[0].decision.at if last else None,
            }
        )
    shown = named(c.context)
    try:
        load_rules(engine.config.rules)
        disk_errors: list[Any] = []
    except RulesError as exc:
        disk_errors = [shown(str(e)) for e in exc.errors]
    except (OSError, ValueError) as exc:
        disk_errors = [shown(f"(rules): {type(exc).__name__}: {exc}")]
    return render(
        request,
        "rules.html",
        viewer,
        files=loaded.files,
        policies=policies,
        disk_errors=disk_errors,
        reload=loaded.reload,
        last_reload=metrics.get_sample_value("gpuops_engine_last_reload_success_timestamp_seconds")
        or None,
        failed_reloads=metrics.get_sample_value(
            "gpuops_engine_rule_reloads_total", {"result": "failure"}
        )
        or 0,
        now=engine.clock(),
        duration=duration,
        can_validate=viewer.can(Permission.RULES_VALIDATE),
    )


RULE_TARGETS = 20
"""Targets shown per policy on the rules page (pending first; the count says how many)."""


AuditQuery = Annotated[str, Query(max_length=256)]


@dataclass(frozen=True)
class AuditFilters:
    """The audit search form's fields (query parameters of the page and of its export)."""

    since: AuditQuery = "24h"
    user: AuditQuery = ""
    action: AuditQuery = ""
    outcome: AuditQuery = ""
    text: AuditQuery = ""
    stream: AuditQuery = "all"


def _audit_documents(
    c: ConsoleDep, viewer: ViewerDep, f: AuditFilters, limit: int
) -> list[dict[str, Any]]:
    need(viewer, Permission.AUDIT_READ, "The audit")
    if f.outcome and f.outcome not in OUTCOMES:
        raise Refused(422, f"outcome: {f.outcome!r} is not one of {', '.join(OUTCOMES)}")
    if f.stream not in STREAMS:
        raise Refused(422, f"stream: {f.stream!r} is not one of {', '.join(STREAMS)}")
    found = search_audit(
        c.context,
        viewer.principal,
        since=f.since or "24h",
        user=f.user or None,
        policy=None,
        action=f.action or None,
        outcome=f.outcome or None,  # type: ignore[arg-type]
        label=[],
        text=f.text or None,
        stream=f.stream,  # type: ignore[arg-type]
        limit=limit,
    )
    return found.documents


Filters = Annotated[AuditFilters, Depends()]


@router.get("/audit", name="search_audit", response_class=HTMLResponse)
def audit_page(request: Request, c: ConsoleDep, viewer: ViewerDep, f: Filters) -> Response:
    documents = _audit_documents(c, viewer, f, 200)
    reads = [
        (s.labels["user"], s.labels["via"], s.labels["route"], int(s.value))
        for m in c.context.engine.audit.registry.collect()
        if m.name == "gpuops_audit_reads"
        for s in m.samples
        if s.name == "gpuops_audit_reads_total"
    ]
    return render(
        request,
        "audit.html",
        viewer,
        reads=sorted(reads),
        documents=[_audit_row(d) for d in documents],
        filters=asdict(f),
        outcomes=OUTCOMES,
        streams=STREAMS,
        export=urlencode(asdict(f)),
    )


COLUMNS: tuple[str, ...] = ("@timestamp", "dataset", "action", "outcome", "user", "roles")
COLUMNS += ("source_ip", "policy", "message", "error")


def _audit_row(doc: dict[str, Any]) -> dict[str, str]:
    """One row of the page and the CSV; an engine row (a decision, an outcome, a skipped
    evaluation: no ``user``) names its actor: the engine, for its policy (``rule.name``)."""
    event, user = doc.get("event", {}), doc.get("user", {})
    roles = user.get("roles", [])
    policy = str(doc.get("rule", {}).get("name", ""))
    name = str(user.get("name", "")) or (f"engine (policy {policy})" if policy else "engine")
    return {
        "@timestamp": str(doc.get("@timestamp", "")),
        "dataset": str(event.get("dataset", "")),
        "action": str(event.get("action", "")),
        "outcome": str(event.get("outcome", "")),
        "user": name,
        "roles": ",".join(roles) if isinstance(roles, list) else str(roles),
        "source_ip": str(doc.get("source", {}).get("ip", "")),
        "policy": policy,
        "message": str(doc.get("message", "")),
        "error": str(doc.get("error", {}).get("message", "")),
    }


FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
"""What a spreadsheet reads as the start of a formula (OWASP's CSV injection list: it skips a
tab or a line break before one)."""


def _csv(rows: Iterable[dict[str, str]]) -> str:
    out = io.StringIO()
    # every cell quoted: a bare carriage return in a label value must not end the row
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    for row in rows:
        # a cell that a spreadsheet would run as a formula is prefixed with ' (shown as text)
        writer.writerow({k: "'" + v if v.startswith(FORMULA_START) else v for k, v in row.items()})
    return out.getvalue()


@router.get("/audit/export.{fmt}", name="search_audit_export")
def audit_export(
    c: ConsoleDep,
    viewer: ViewerDep,
    fmt: Annotated[str, Path(pattern="^(csv|ndjson)$")],
    f: Filters,
) -> Response:
    documents = _audit_documents(c, viewer, f, 1000)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    headers = {
        "content-disposition": f'attachment; filename="gpuops-audit-{stamp}.{fmt}"',
        "x-content-type-options": "nosniff",
        "cache-control": "no-store",
    }
    if fmt == "csv":
        body = _csv(_audit_row(d) for d in documents)
        return Response(body, media_type="text/csv; charset=utf-8", headers=headers)
    body = "".join(json.dumps(d, sort_keys=True) + "\n" for d in documents)
    return Response(body, media_type="application/x-ndjson", headers=headers)
