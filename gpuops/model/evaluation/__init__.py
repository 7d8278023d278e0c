"""Evaluation: one policy's targets through their state machine, from what Prometheus answered to
decisions, and the verdicts fed back. Pure: no I/O, no clock, no globals.

From the top: ``evaluator`` (``evaluate``: the general path, and the order the others are
tried in), ``fastpath`` (the steady and churn paths) and ``stale`` (a failed query, stale input
series), ``machine`` (one target's transitions and decisions), ``settling`` (``settle_all``,
``failed``: verdicts and outcomes back into the state) and ``alertmanager`` (``evaluate_alert``),
``step`` (``QueryResult``, ``Freshness``, ``Step``), ``state`` (``TargetState``, ``PolicyState``).
Used by ``gpuops.runtime``, ``gpuops.store`` (the state), ``gpuops.offline`` and ``gpuops.sim``;
the public names are re-exported here (``from gpuops.model.evaluation import evaluate``).
"""

from gpuops.model.evaluation.alertmanager import evaluate_alert
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.machine import index_targets
from gpuops.model.evaluation.settling import Settled, failed, settle, settle_all
from gpuops.model.evaluation.state import Delta, PolicyState, Quiet, Status, TargetState
from gpuops.model.evaluation.step import Freshness, QueryResult, Step

__all__ = [
    "Delta",
    "Freshness",
    "PolicyState",
    "QueryResult",
    "Quiet",
    "Settled",
    "Status",
    "Step",
    "TargetState",
    "evaluate",
    "evaluate_alert",
    "failed",
    "index_targets",
    "settle",
    "settle_all",
]
