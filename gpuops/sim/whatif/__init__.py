"""`gpuops whatif`: one seeded workload twice — policies off, and policies on with the real
engine evaluating them at a virtual clock against a real Prometheus fed by remote write — and
what each achieved (docs/whatif.md).

Called by ``gpuops.cli.whatif`` and the benchmark. The "on" run builds the real
``gpuops.runtime.Engine`` with a virtual clock (its wall and its monotonic clock) and drives it
without its scheduler: ``PolicyLoop.evaluate(t)`` runs ``Engine.evaluate_group`` for every
group whose interval divides ``t`` (and every cron ``schedule`` policy due at ``t``), then
waits until the gate has finished every action it started. The fleet
(``gpuops.sim.fleet.virtual``) does not move meanwhile, so an action decided at virtual ``t``
is in the cluster before it advances, and every sample up to ``t`` is in Prometheus before
the engine queries it (lockstep). Rules, PromQL, guardrails, state, audit and the ``fleet``
executor (over the fleet's control API on loopback) are the engine's own; nothing here
evaluates a policy.

From the top: ``report`` and ``plots`` (the two runs compared as text, JSON and PNG), ``both``
(both runs of one workload), ``runs`` (each run), ``loop`` (the policy loop at the virtual
clock), ``lockstep`` (the engine's Prometheus client), ``queries`` (what the rules read),
``prometheus`` (the run's own Prometheus) and ``errors``.
"""

from gpuops.sim.whatif.both import Whatif, whatif
from gpuops.sim.whatif.errors import WhatifError
from gpuops.sim.whatif.loop import group_queries
from gpuops.sim.whatif.runs import (
    CLUSTER_STEP_S,
    PARTS,
    SCRAPE_INTERVAL_S,
    RunResult,
    record_interval,
    run_off,
    run_on,
)

__all__ = [
    "CLUSTER_STEP_S",
    "PARTS",
    "SCRAPE_INTERVAL_S",
    "RunResult",
    "Whatif",
    "WhatifError",
    "group_queries",
    "record_interval",
    "run_off",
    "run_on",
    "whatif",
]
