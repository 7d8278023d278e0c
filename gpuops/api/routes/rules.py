"""``/api/v1/rules`` and ``/api/v1/rule-files``: list and show policies, validate a posted file,
reload, and (admins) write a rule file into the rules directory.

Rule files are found among the configured rule paths by their plain name only — a name is never
joined into a path unless it matches ``FILE_PATTERN`` and resolves inside the rules directory, so
``../`` and absolute names are refused. What ``PUT /rule-files/{name}`` answers names files the
same way (``extra.yaml:4: ...``), never by the engine host's paths.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, PlainTextResponse

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.responses.rules import (
    LastEvaluationOut,
    PolicyDetailOut,
    ReloadOut,
    ReloadRefusedOut,
    ReloadStateOut,
    RuleFileRefusedOut,
    RuleFilesOut,
    RuleFileWrittenOut,
    RulesOut,
    TargetReadinessOut,
    TargetsOut,
    ValidationOut,
    listed_policy,
    problems,
)
from gpuops.api.schemas import FILE_PATTERN, NAME_PATTERN, InvalidRequestOut, Responses, refusal
from gpuops.api.tokens import Permission, Principal
from gpuops.model.readiness import readiness
from gpuops.model.rules.loader import load_rules_text, rule_files
from gpuops.model.rules.model import RulesError
from gpuops.offline.promtool import PromtoolError
from gpuops.offline.rulecheck import (  # the registry checks, never runs
    ExecutorRegistry,
    check_rules,
)

log = logging.getLogger(__name__)

router = APIRouter(tags=["rules"])

Ctx = Annotated[ApiContext, Depends(api_context)]
PolicyName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="Policy name.")]
FileName = Annotated[str, PathParam(pattern=FILE_PATTERN, description="Rule file name.")]
_FILE_TEXT: Responses = {
    200: {
        "description": "The file (YAML).",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}
_TEXT_BODY = {
    "requestBody": {
        "required": True,
        "content": {"text/plain": {"schema": {"type": "string", "maxLength": 1048576}}},
        "description": "A rule file (YAML).",
    }
}
"""The OpenAPI of a route that reads its body as text itself."""


@router.get("/rules")
def list_rules(
    ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.RULES_READ))]
) -> RulesOut:
    """The running policies, each with its last evaluation (``last_evaluation``: the evaluation
    time, and ``skipped``: why it did not evaluate, e.g. a failed or stale query), and the last
    reload tried (``reload``: ok, when, its file:line errors if it failed)."""
    rules = ctx.engine.rules
    last = ctx.engine.cycle.last_evaluation
    shown = named(ctx)
    policies = []
    for policy in rules.policies():
        seen = last.get(policy.name)
        evaluated = None if seen is None else LastEvaluationOut(at=seen.at, skipped=seen.skipped)
        policies.append(listed_policy(policy, evaluated, shown))
    reload = ctx.engine.rulebook.last_reload
    return RulesOut(
        files=[shown(f) for f in rules.files],
        policies=policies,
        reload=None
        if reload is None
        else ReloadStateOut(ok=reload.ok, at=reload.at, errors=[shown(e) for e in reload.errors]),
    )


@router.get("/rules/{name}/targets", responses=refusal(404, "No policy of that name is loaded."))
def rule_targets(
    name: PolicyName,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.RULES_READ))],
    limit: Annotated[int, Query(ge=0, le=1000)] = 50,
) -> TargetsOut:
    """Why has it not acted? Its targets pending or firing now (pending first), each with
    when it may act next and what it waits for (its ``for``, cooldown, ``max_per_hour``,
    ``repeat_interval``, a guardrail holding it back)."""
    policy = ctx.engine.rules.policy(name)
    if policy is None:
        raise HTTPException(404, f"no policy named {name!r} is loaded")
    engine = ctx.engine
    found, total = readiness(
        policy,
        engine.store.policy_state(name),
        engine.store.guardrail_state(),
        engine.clock(),
        limit,
    )
    return TargetsOut(policy=name, total=total, targets=[TargetReadinessOut.of(r) for r in found])


def named(ctx: ApiContext) -> Callable[[str], str]:
    """How answers name rule files: by their name in the rules directory, not by a path on
    the engine host (``extra.yaml:4``)."""
    return _names(ctx.engine.config.rules)


@router.get("/rules/{name}", responses=refusal(404, "No policy of that name is loaded."))
def show_rule(
    name: PolicyName, ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.RULES_READ))]
) -> PolicyDetailOut:
    """One running policy, every setting."""
    policy = ctx.engine.rules.policy(name)
    if policy is None:
        raise HTTPException(404, f"no policy named {name!r} is loaded")
    detail = PolicyDetailOut.of(policy)
    return detail.model_copy(update={"source": named(ctx)(detail.source)})


def _validate(text: str, filename: str, promql: bool, registry: ExecutorRegistry) -> ValidationOut:
    """The engine's checks (``gpuops.offline.rulecheck``) of one posted file; PromQL when asked."""
    try:
        ruleset = load_rules_text(text, filename)
    except RulesError as exc:
        return ValidationOut(
            ok=False, policies=0, promql_checked=False, errors=problems(exc.errors)
        )
    unchecked: list[str] = []  # why promtool could not check the PromQL

    def no_promtool(exc: PromtoolError) -> None:
        unchecked.append(f"PromQL not checked: {exc}")

    errors = check_rules(
        ruleset,
        registry,
        check_promql=promql,
        without_promtool=no_promtool,
    )
    return ValidationOut(
        ok=not errors,
        policies=sum(1 for _ in ruleset.policies()),
        promql_checked=promql and not unchecked,
        note=unchecked[-1] if unchecked else None,
        errors=problems(errors),
    )


async def _text(request: Request) -> str:
    try:
        return (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the body is not UTF-8 text") from None


@router.post(
    "/rules/validate",
    openapi_extra=_TEXT_BODY,
    responses=refusal(400, "The body is not UTF-8 text."),
)
async def validate_rules(
    request: Request,
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.RULES_VALIDATE))],
    filename: Annotated[str, Query(pattern=FILE_PATTERN)] = "posted.yaml",
    promql: Annotated[bool, Query(description="Also check PromQL with promtool.")] = False,
) -> ValidationOut:
    """Validate a rule file (the body, YAML) as the engine would load it (executor verbs and
    params included); errors are ``file:line: message``."""
    text = await _text(request)
    registry = ctx.engine.registry
    return await anyio.to_thread.run_sync(_validate, text, filename, promql, registry)


def _reload(ctx: ApiContext, shown: Callable[[str], str] = str) -> ReloadOut | ReloadRefusedOut:
    """Reload; the refusal names each error as ``shown`` makes it."""
    result = ctx.engine.reload()
    if not result.ok:
        return ReloadRefusedOut(
            detail=f"rules not reloaded ({len(result.errors)} errors); "
            f"the running {result.policies} policies stay in place",
            errors=[shown(e) for e in result.errors],
        )
    return ReloadOut(ok=True, policies=result.policies)


def _refused(refusal: ReloadRefusedOut | RuleFileRefusedOut) -> JSONResponse:
    return JSONResponse(refusal.model_dump(mode="json"), status_code=422)


@router.post(
    "/rules/reload",
    response_model=ReloadOut,
    responses=refusal(
        422, "The rules did not load; the running ones stay.", ReloadRefusedOut | InvalidRequestOut
    ),
)
def reload_rules(
    ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.RULES_WRITE))]
) -> ReloadOut | JSONResponse:
    """Read the rule files again; on any error the running rules stay (422 with the errors)."""
    answer = _reload(ctx, shown=_names(ctx.engine.config.rules))
    return _refused(answer) if isinstance(answer, ReloadRefusedOut) else answer


def _files(ctx: ApiContext) -> dict[str, Path]:
    found, _ = rule_files(ctx.engine.config.rules)
    by_name: dict[str, Path] = {}
    for path in found:
        by_name.setdefault(path.name, path)
    return by_name


@router.get("/rule-files")
def list_rule_files(
    ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.RULES_READ))]
) -> RuleFilesOut:
    """The rule files the engine reads."""
    return RuleFilesOut(files=sorted(_files(ctx)))


@router.get(
    "/rule-files/{name}",
    # the answer is text, its refusals JSON: ``Response`` (no media type of its own) keeps the
    # refusals' schemas under application/json in the spec
    response_class=Response,
    responses=_FILE_TEXT | refusal(404, "No rule file of that name."),
)
def show_rule_file(
    name: FileName, ctx: Ctx, _: Annotated[Principal, Depends(require(Permission.RULES_READ))]
) -> PlainTextResponse:
    """The text of one rule file."""
    path = _files(ctx).get(name)
    if path is None:
        raise HTTPException(404, f"no rule file named {name!r}")
    return PlainTextResponse(path.read_text(encoding="utf-8"), media_type="text/plain")


def _rules_dir(ctx: ApiContext) -> Path:
    for path in ctx.engine.config.rules:
        if path.is_dir():
            return path.resolve()
    raise HTTPException(409, "no rules directory is configured; rule files cannot be written")


@router.put(
    "/rule-files/{name}",
    openapi_extra=_TEXT_BODY,
    response_model=RuleFileWrittenOut,
    responses=refusal(400, "Not UTF-8 text, or not a plain file name.")
    | refusal(409, "No rules directory is configured.")
    | refusal(
        422,
        "Not a valid rule file, or the rules do not load with it (nothing changed).",
        RuleFileRefusedOut | ReloadRefusedOut | InvalidRequestOut,
    )
    | refusal(500, "The file cannot be written or put back."),
)
async def put_rule_file(
    name: FileName,
    request: Request,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Permission.RULES_WRITE))],
) -> RuleFileWrittenOut | JSONResponse:
    """Write a rule file into the rules directory (validated first) and reload; when the whole
    rule set does not load, the previous file is put back (422 with the errors). Errors name
    rule files by their name in the rules directory, never by a path on the engine host."""
    text = await _text(request)
    return await anyio.to_thread.run_sync(_write_rule_file, ctx, name, text, principal.name)


def _write_rule_file(
    ctx: ApiContext, name: str, text: str, user: str
) -> RuleFileWrittenOut | JSONResponse:
    checked = _validate(text, name, promql=False, registry=ctx.engine.registry)
    if not checked.ok:
        return _refused(
            RuleFileRefusedOut(detail=f"{name} is not a valid rule file", errors=checked.errors)
        )
    directory = _rules_dir(ctx)
    target = (directory / name).resolve()
    if target.parent != directory:
        raise HTTPException(400, f"{name!r} is not a plain file name inside the rules directory")
    try:
        previous = target.read_bytes() if target.exists() else None
        _atomic_write(target, text.encode("utf-8"))
    except OSError as exc:
        log.error("rule file %s not written: %s", target, exc)
        raise HTTPException(
            500, f"{name} not written into the rules directory ({_reason(exc)}); nothing changed"
        ) from None
    answer = _reload(ctx, shown=_names(ctx.engine.config.rules))
    if isinstance(answer, ReloadRefusedOut):
        try:
            if previous is None:
                target.unlink()
            else:
                _atomic_write(target, previous)
        except OSError as exc:
            log.error("rule file %s not put back: %s", target, exc)
            raise HTTPException(
                500,
                f"{name} was written but the rules do not load, and the previous {name} could "
                f"not be put back ({_reason(exc)}); the running rules stay in place, fix or "
                f"remove {name} in the rules directory",
            ) from None
        ctx.engine.reload()
        return _refused(answer)
    log.info("rule file %s written by %s", target, user)
    return RuleFileWrittenOut(ok=answer.ok, policies=answer.policies, file=name)


def _reason(exc: OSError) -> str:
    """What went wrong, without the path the exception may carry."""
    return exc.strerror or type(exc).__name__


def _names(paths: Sequence[Path]) -> Callable[[str], str]:
    """A rewrite of error texts that names each rule file by its name, not its path on the
    engine host: a directory's path before its files is dropped, a configured file's path
    becomes its name (as given and resolved; matched only where a path starts: at the start,
    after a space, a parenthesis or a quote)."""
    replace: dict[str, str] = {}
    for path in paths:
        for form in dict.fromkeys((str(path), str(path.resolve()))):
            if path.is_dir():
                replace[form + os.sep] = ""
            replace.setdefault(form, path.name)
    if not replace:
        return str
    forms = sorted(replace, key=len, reverse=True)
    pattern = re.compile(r"(?<![^\s(\"'])(?:" + "|".join(map(re.escape, forms)) + ")")
    return lambda text: pattern.sub(lambda m: replace[m.group(0)], text)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gpuops-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
