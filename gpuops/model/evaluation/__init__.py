"""Evaluation: one policy's targets through their state machine, from what Prometheus answered to
decisions, and the verdicts fed back. Pure: no I/O, no clock, no globals.

From the top: ``evaluator`` (``evaluate``: the general path, and the order the others are
tried in), ``fastpath`` (the steady and churn paths) and ``stale`` (a failed query, stale input
series), ``machine`` (one target's transitions and decisions), ``settling`` (``settle_all``,
``failed``: verdicts and outcomes back into the state) and ``alertmanager`` (``evaluate_alert``),
``step`` (``QueryResult``, ``Freshness``, ``Step``), ``state`` (``TargetState``, ``PolicyState``).
Used by ``gpuops.runtime``, ``gpuops.store`` (the state), ``gpuops.offline`` and ``gpuops.sim``.
"""
