"""The gate: the one component that calls executors.

Every action — policy fire, clear and repeat, granted approval, quota grant and its end,
Alertmanager-triggered, resumed after a crash, retried after a failure — reaches an executor
only through ``Gate.admit`` (or its ``resume`` and ``reconcile``). The gate:

1. writes the intent (decision + verdict) of every decision it is handed to the audit spool,
   fsync'd, in one write, *before* any of them runs (write-ahead: ``trail``); when the spool
   cannot take it (disk full, unwritable) nothing runs, ``problem`` says why (``/healthz`` turns
   red), a metric counts it, and ``reconcile`` writes it and runs the actions once the spool is
   writable again;
2. checks again at the moment of execution, in the worker (``holds``): kill switch, pause,
   engine and policy dry-run, the global budget — an action held there is audited with its
   reason like any suppression and decided again later;
3. runs the action on the workers of its executor's lane (``lanes``: the webhook's receiver;
   bounded concurrency per lane, a bounded number of lanes: one slow receiver cannot starve the
   others) through ``gpuops.actions.base.execute``;
4. stores and audits the outcome (``outcomes``: outcomes that finish together share one write),
   and feeds a failure back into the policy's state (``feedback``): a permanent failure is not
   retried within the episode, a temporary one is decided again after an exponential backoff
   with a cap.

At start, ``resume`` writes what the state file holds and the spool lacks (``reconcile``) and
runs again the actions a crash interrupted (executors are idempotent by decision id); an admin's
``retry`` of a failed action decides its target again (``retry``). Built by
``gpuops.runtime.facade.Engine``; the cycle, approvals, quota and the alert inbox hand it work.
Only this package runs executors (the "One gate" import-linter contract in pyproject.toml).
"""

from gpuops.runtime.gate.feedback import MAX_RETRY_S
from gpuops.runtime.gate.gate import (
    CANCELLED_PREFIX,
    DRY_RUN_PREFIX,
    NOT_LEADING,
    ExecutorsRefused,
    Gate,
    OutcomeHook,
)
from gpuops.runtime.gate.lanes import LANES_PER_EXECUTOR
from gpuops.runtime.gate.retry import STEPS_RETRIED_ELSEWHERE, RetryError
from gpuops.runtime.gate.told import FIELDS, Told
from gpuops.runtime.gate.trail import DecisionListener

__all__ = [
    "CANCELLED_PREFIX",
    "DRY_RUN_PREFIX",
    "ExecutorsRefused",
    "LANES_PER_EXECUTOR",
    "MAX_RETRY_S",
    "NOT_LEADING",
    "FIELDS",
    "DecisionListener",
    "Gate",
    "OutcomeHook",
    "RetryError",
    "STEPS_RETRIED_ELSEWHERE",
    "Told",
]
