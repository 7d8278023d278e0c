"""The console's forms (POST): kill switch and pause (with a confirmation), grant or deny an
approval (with a reason), submit / approve / deny a quota request, validate a pasted rule file.

Every form carries the session's CSRF token. Each handler checks the permission of the API route
it stands for and then calls that route's function, so the engine is reached exactly as through
the API (grant and deny through the engine, which runs the guardrails again; the kill switch and
pause still apply). Audited by ``AuditedRoute`` under the API route's name, with the reason typed.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import anyio.to_thread
from fastapi import APIRouter, Form, Path, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

from gpuops.api.console.web import (
    AuditedRoute,
    ConsoleDep,
    Refused,
    ViewerDep,
    check_csrf,
    need,
    render,
)
from gpuops.api.routes.control import pause_engine, resume_engine, set_kill_switch
from gpuops.api.routes.decisions import deny_approval, grant_approval, retry_decision
from gpuops.api.routes.quota import approve_quota_request, deny_quota_request, submit_quota_request
from gpuops.api.routes.rules import _validate
from gpuops.api.schemas import FILE_PATTERN, ID_PATTERN, QuotaRequestIn
from gpuops.api.tokens import Permission

router = APIRouter(route_class=AuditedRoute, include_in_schema=False)

Csrf = Annotated[str, Form(max_length=128)]
Id = Annotated[str, Path(pattern=ID_PATTERN)]


def _confirmed(confirm: str, what: str) -> None:
    if confirm != "yes":
        raise Refused(422, f"{what} was not done: tick the confirmation box to confirm it")


def _done(request: Request, viewer: ViewerDep, title: str, text: str, back: str) -> Response:
    return render(request, "message.html", viewer, title=title, text=text, back=back)


@router.post("/control/kill-switch/{state}", name="set_kill_switch", response_class=HTMLResponse)
def kill_switch(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    state: Literal["on", "off"],
    csrf: Csrf = "",
    confirm: Annotated[str, Form(max_length=8)] = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.ENGINE_CONTROL, "Turning the kill switch on or off")
    _confirmed(confirm, f"Turning the kill switch {state}")
    set_kill_switch(state, c.context, viewer.principal)
    text = (
        "The kill switch is ON: no action runs until it is turned off."
        if state == "on"
        else "The kill switch is off: actions run again (unless the engine is paused)."
    )
    return _done(request, viewer, f"Kill switch {state}", text, "/")


@router.post("/control/{what}", name="pause_engine", response_class=HTMLResponse)
def pause_or_resume(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    what: Literal["pause", "resume"],
    csrf: Csrf = "",
    confirm: Annotated[str, Form(max_length=8)] = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.ENGINE_CONTROL, "Pausing or resuming the engine")
    _confirmed(confirm, "Pausing the engine" if what == "pause" else "Resuming the engine")
    if what == "pause":
        pause_engine(c.context, viewer.principal)
        text = "The engine is paused: decisions are taken and audited as suppressed."
    else:
        request.state.gpuops_action = "resume_engine"
        resume_engine(c.context, viewer.principal)
        text = "The engine acts again."
    title = "Engine paused" if what == "pause" else "Engine resumed"
    return _done(request, viewer, title, text, "/")


Reason = Annotated[str, Form(max_length=1000)]


def _reason(request: Request, reason: str, what: str) -> None:
    if not reason.strip():
        raise Refused(422, f"{what} needs a reason: say why in the Reason field")
    request.state.console_note = reason.strip()


@router.post("/approvals/{decision_id}/grant", name="grant_approval", response_class=HTMLResponse)
def grant(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    decision_id: Id,
    csrf: Csrf = "",
    reason: Reason = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.APPROVALS_DECIDE, "Granting an approval")
    _reason(request, reason, "Granting")
    doc = grant_approval(decision_id, c.context, viewer.principal)
    text = (
        f"Granted: {doc.action.type if doc.action else 'the action'} on "
        f"{doc.target.key} — verdict {doc.verdict}. The action runs now unless a "
        "guardrail holds it; the decision page shows the outcome."
    )
    return _done(request, viewer, "Approval granted", text, f"/decisions/{decision_id}")


@router.post("/approvals/{decision_id}/deny", name="deny_approval", response_class=HTMLResponse)
def deny(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    decision_id: Id,
    csrf: Csrf = "",
    reason: Reason = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.APPROVALS_DECIDE, "Denying an approval")
    _reason(request, reason, "Denying")
    doc = deny_approval(decision_id, c.context, viewer.principal)
    text = f"Denied: nothing runs on {doc.target.key}."
    return _done(request, viewer, "Approval denied", text, f"/decisions/{decision_id}")


@router.post("/decisions/{decision_id}/retry", name="retry_decision", response_class=HTMLResponse)
def retry(
    request: Request, c: ConsoleDep, viewer: ViewerDep, decision_id: Id, csrf: Csrf = ""
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.APPROVALS_DECIDE, "Retrying a failed action")
    accepted = retry_decision(decision_id, c.context, viewer.principal)
    text = (
        f"Retry accepted: {accepted.policy} decides {accepted.target} again at its next "
        "evaluation, through the guardrails; the decisions page shows the new decision."
    )
    return _done(request, viewer, "Retry accepted", text, f"/decisions/{decision_id}")


@router.post("/quota", name="submit_quota_request", response_class=HTMLResponse)
def submit_quota(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    csrf: Csrf = "",
    project: Annotated[str, Form(max_length=64)] = "",
    gpus: Annotated[str, Form(max_length=10)] = "",
    duration: Annotated[str, Form(max_length=32)] = "",
    reason: Reason = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.QUOTA_REQUEST, "Asking for quota")
    # a form field is text; the API takes only a JSON integer, so the form's digits become one
    count: int | str = int(gpus) if gpus.isascii() and gpus.isdigit() else gpus
    try:
        body = QuotaRequestIn(project=project, gpus=count, duration=duration, reason=reason)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise Refused(422, f"the quota request was not submitted: {problems}") from None
    doc = submit_quota_request(body, c.context, viewer.principal)
    text = f"Request {doc.id} for {doc.gpus} GPUs ({doc.project}) waits for an admin."
    return _done(request, viewer, "Quota requested", text, "/quota")


@router.post("/quota/{request_id}/{verb}", name="approve_quota_request")
def decide_quota(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    request_id: Id,
    verb: Literal["approve", "deny"],
    csrf: Csrf = "",
    reason: Reason = "",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.QUOTA_DECIDE, "Deciding a quota request")
    if reason.strip():
        request.state.console_note = reason.strip()
    if verb == "approve":
        doc = approve_quota_request(request_id, c.context, viewer.principal)
    else:
        request.state.gpuops_action = "deny_quota_request"
        doc = deny_quota_request(request_id, c.context, viewer.principal)
    text = f"Request {doc.id} ({doc.project}, {doc.gpus} GPUs) is {doc.status}."
    return _done(request, viewer, f"Quota request {doc.status}", text, "/quota")


@router.post("/rules/validate", name="validate_rules", response_class=HTMLResponse)
async def validate(
    request: Request,
    c: ConsoleDep,
    viewer: ViewerDep,
    csrf: Csrf = "",
    text: Annotated[str, Form(max_length=1_048_576)] = "",
    filename: Annotated[str, Form(max_length=128)] = "pasted.yaml",
) -> Response:
    check_csrf(viewer, csrf)
    need(viewer, Permission.RULES_VALIDATE, "Validating a rule file")
    if not re.fullmatch(FILE_PATTERN, filename):
        raise Refused(422, f"file name: {filename!r} is not a plain *.yaml or *.yml name")
    registry = c.context.engine.registry  # the engine's executors check verbs and params
    result = await anyio.to_thread.run_sync(_validate, text, filename, False, registry)
    return render(request, "validated.html", viewer, result=result, text=text, filename=filename)
