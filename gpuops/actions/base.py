"""The executor contract and the single place that turns whatever an executor raises into an
``Outcome`` (with retries and backoff for temporary errors, ``gpuops.actions.retry``).

Executors raise ``TemporaryError`` (retried) or ``PermanentError`` (not); anything else is a bug
in the executor and becomes a failed outcome with its type and message. ``gpuops.runtime.gate``
(the only caller of executors) calls ``execute``; executors never see the guardrails or the audit.
The registry of executors (``gpuops.actions.registry``) builds them and says which verbs each
does and what params it takes; it never runs one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gpuops.actions.results import ExecutorResult, changes
from gpuops.actions.retry import RetryPolicy
from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, freeze
from gpuops.model.guardrails import Standing

log = logging.getLogger(__name__)

DEFAULT_RETRY = RetryPolicy()

CANCELLED_PREFIX = "cancelled: "
"""How the error of an action's outcome starts when its run was cancelled (``Cancelled``)."""


class ExecutorError(Exception):
    """Base of what executors raise."""


class TemporaryError(ExecutorError):
    """The action may succeed if tried again (timeouts, 5xx, connection refused)."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(ExecutorError):
    """Trying again will not help (4xx, bad parameters, no permission)."""


class Cancelled(ExecutorError):
    """The run was stopped before its end because ``cancelled`` said why (``run_cancellable``):
    what it did so far stays; it runs again, whole, with the same decision id."""


Cancel = Callable[[], "str | None"]
"""Why a running action must stop now (the kill switch, pause, the operation stopped), or
None: asked by an executor's ``run_cancellable`` while it waits on what it started."""


@runtime_checkable
class Executor(Protocol):
    """Carries out the verbs it supports. ``run`` returns what it changed: a typed ``Result``
    (``gpuops.actions.results``), or a JSON-able mapping.

    ``verbs``: the verbs it does; None: any verb (the free-form executors: webhook, command,
    log). An executor registered by entry point (``gpuops.executors``) declares its own and
    gets each decision's params as written, whatever the verb (it may parse those of a verb of
    ``gpuops.model.verbs`` with ``VERBS[verb].parse``). Optionally, on the class,
    ``check_params(verb, params) -> list[str]``: the problems of a policy's params, which the
    rule checks report before any decision (``webhook``, ``command``); without it, an
    executor's params are not checked at load (the verb table's checks are the built-in
    executors', ``gpuops.model.verbs.Verb.checked``).

    Optionally ``standing(decision) -> Standing`` (``gpuops.model.guardrails``): what it reads
    of the target at execution time for the gate (the ``kubernetes`` executor: a veto label, the
    nodes already unschedulable or NotReady); see ``standing``.

    Optionally ``lane(decision) -> str``: what a slow or failing action of ``decision`` holds
    up (the ``webhook`` executor: the receiver's origin). The gate gives each lane workers of
    its own; see ``lane``.

    Optionally ``run_cancellable(decision, cancelled: Cancel)``: ``run`` that asks
    ``cancelled`` while it waits and stops what it started when it names a reason, raising
    ``Cancelled`` (the ``command`` executor kills the program's process group, the ``ansible``
    executor cancels the playbook run through ansible-runner). A batch step configured with
    ``on_stop: cancel`` runs through it (``execute``'s ``cancelled``)."""

    name: str
    verbs: frozenset[str] | None

    def run(self, decision: Decision) -> ExecutorResult: ...


def lane(executor: Executor, decision: Decision) -> str:
    """The lane of ``decision`` on ``executor``: what its optional ``lane`` method names, or
    ``""`` (one lane for the whole executor, also when the method fails: ``run`` then reports
    the problem as the action's outcome). Asked by ``gpuops.runtime.gate`` before it queues
    an action, so that a slow lane delays only its own actions. A lane may come from label
    values (a templated host): the gate caps how many lanes get workers of their own."""
    method = getattr(executor, "lane", None)
    if method is None:
        return ""
    try:
        key = method(decision)
    except Exception:  # an executor bug must not keep the action from running
        log.exception("executor %s: lane of decision %s failed", executor.name, decision.id)
        return ""
    return key if isinstance(key, str) else ""


def standing(executor: Executor, decision: Decision) -> Standing | None:
    """What ``executor``'s optional ``standing`` method reads of ``decision``'s target now (a
    veto label, the targets already out of service), asked by the gate before it runs the
    action (``gpuops.runtime.gate.holds``); None when it has none or it fails (logged: the
    action's run then meets the same problem and its outcome says it)."""
    method = getattr(executor, "standing", None)
    if method is None:
        return None
    try:
        found = method(decision)
    except Exception as exc:  # the API server unreachable...: the run reports it
        log.warning(
            "executor %s: standing of decision %s unknown: %s", executor.name, decision.id, exc
        )
        return None
    return found if isinstance(found, Standing) else None


def execute(
    executor: Executor,
    decision: Decision,
    retry: RetryPolicy = DEFAULT_RETRY,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    interrupted: Callable[[], str | None] = lambda: None,
    cancelled: Cancel | None = None,
) -> Outcome:
    """Run ``decision`` on ``executor``; never raises. The one place failures become Outcomes.

    ``interrupted`` is asked before every try after the first (the gate's kill switch and
    pause): when it names a reason, no further try starts and the outcome is ``skipped`` with
    that reason. ``cancelled``: asked during the run by an executor that can stop what it
    started (``run_cancellable``); a run it stops is ``skipped``, ``cancelled: <why>``."""
    cancellable = getattr(executor, "run_cancellable", None)
    verb = decision.action.type if decision.action else ""
    if executor.verbs is not None and verb not in executor.verbs:
        supported = ", ".join(sorted(executor.verbs))
        return Outcome(
            OutcomeStatus.FAILURE,
            error=f"executor {executor.name!r} does not support action {verb!r} "
            f"(supported: {supported})",
            permanent=True,
        )
    started = clock()
    attempt = 0
    delay = retry.backoff_s
    while True:
        attempt += 1
        try:
            if cancelled is not None and cancellable is not None:
                changed = cancellable(decision, cancelled)
            else:
                changed = executor.run(decision)
        except Cancelled as exc:
            log.warning("%s %s on %s: cancelled: %s", executor.name, verb, decision.target.key, exc)
            return Outcome(
                OutcomeStatus.SKIPPED,
                attempts=attempt,
                duration_s=clock() - started,
                error=f"{CANCELLED_PREFIX}{exc}",
            )
        except TemporaryError as exc:
            if attempt >= retry.attempts:
                log.warning(
                    "%s %s on %s failed after %d attempts: %s",
                    executor.name,
                    verb,
                    decision.target.key,
                    attempt,
                    exc,
                )
                return _failed(exc, attempt, clock() - started)
            wait = min(exc.delay if exc.delay is not None else delay, retry.max_backoff_s)
            log.info(
                "%s %s on %s: %s; will try again in %.1f seconds",
                executor.name,
                verb,
                decision.target.key,
                exc,
                wait,
            )
            sleep(wait)
            delay *= 2
            why = interrupted()
            if why is not None:
                log.warning(
                    "%s %s on %s: not tried again: %s",
                    executor.name,
                    verb,
                    decision.target.key,
                    why,
                )
                return Outcome(
                    OutcomeStatus.SKIPPED, attempts=attempt, duration_s=clock() - started, error=why
                )
            continue
        except PermanentError as exc:
            log.warning("%s %s on %s failed: %s", executor.name, verb, decision.target.key, exc)
            return _failed(exc, attempt, clock() - started, permanent=True)
        except Exception as exc:  # an executor bug must not take the engine down
            log.exception("executor %s raised unexpectedly", executor.name)
            return _failed(exc, attempt, clock() - started, prefix=f"{type(exc).__name__}: ")
        return Outcome(
            OutcomeStatus.SUCCESS,
            attempts=attempt,
            duration_s=clock() - started,
            changed=freeze(changes(changed)),
        )


def _failed(
    exc: BaseException, attempts: int, duration: float, prefix: str = "", permanent: bool = False
) -> Outcome:
    return Outcome(
        OutcomeStatus.FAILURE,
        attempts=attempts,
        duration_s=duration,
        error=f"{prefix}{exc}"[:1024],
        permanent=permanent,
    )
