"""``SqlStore``: the repositories of ``gpuops.store.sql`` joined into one
``gpuops.store.interface.Store``, whose writes that take ``db`` share the transaction
``transaction()`` yields. ``gpuops.store.sqlite.StateStore`` and
``gpuops.store.postgres.PostgresStore`` complete it with their connection and their transaction.
"""

from __future__ import annotations

from gpuops.store.sql.alerts import SqlAlerts
from gpuops.store.sql.approvals import SqlApprovals
from gpuops.store.sql.batch import SqlBatch
from gpuops.store.sql.controls import SqlControls
from gpuops.store.sql.decisions import SqlDecisions
from gpuops.store.sql.guardrails import SqlGuardrails
from gpuops.store.sql.health import SqlHealth
from gpuops.store.sql.policy_states import SqlPolicyStates
from gpuops.store.sql.quota import SqlQuotaRequests
from gpuops.store.sql.repairs import SqlRepairs


class SqlStore(
    SqlPolicyStates,
    SqlGuardrails,
    SqlDecisions,
    SqlApprovals,
    SqlQuotaRequests,
    SqlAlerts,
    SqlControls,
    SqlHealth,
    SqlBatch,
    SqlRepairs,
):
    """Every repository in the SQL both backends speak (``ON CONFLICT``, ``RETURNING``, ``?``
    placeholders); a backend adds ``close``, ``_atomic`` and ``_check_cache``."""
