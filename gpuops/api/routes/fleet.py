"""``/api/v1/fleet`` and ``/api/v1/timeline``: the fleet now (nodes, GPUs, queue, and what
gpuops holds on each) and over time (decisions and outcomes, utilization and queue length).

Asks the engine's Prometheus the series the policies read (``gpuops.api.fleetview.QUERIES``)
and reads the holds from the engine's state: every target of a policy whose episode goes on
after a fire that ran. A query Prometheus does not answer is named in ``errors`` and its data is
missing, never taken as healthy. The console's Fleet and Timeline pages call these functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.fleetview import QUERIES, Held, Readings, fleet, hold_of
from gpuops.api.responses.fleet import (
    EventOut,
    FleetOut,
    PointOut,
    SeriesOut,
    TimelineOut,
)
from gpuops.api.schemas import NAME_PATTERN
from gpuops.api.tokens import Permission, Principal
from gpuops.model.decisions import Decision, Sample, Transition, Verdict, decision_id
from gpuops.model.evaluation.state import Status, TargetState
from gpuops.model.telling import effect, state, summary
from gpuops.sources import QueryError
from gpuops.store.interface import DecisionStatus, StoredDecision

router = APIRouter(tags=["fleet"])

Ctx = Annotated[ApiContext, Depends(api_context)]
Pool = Annotated[
    str | None, Query(pattern=NAME_PATTERN, description="Only this pool's nodes and queue.")
]

UTILIZATION = "avg by (pool) (nvml_gpu_utilization_ratio)"
QUEUE = "sum by (pool) (gpuops_queue_pending_jobs)"
MAX_RANGE_S = 7 * 86400
"""The longest time range a timeline may show."""
POINTS = 240
"""About how many steps a timeline's charts have (the step follows from the range)."""
MIN_STEP_S = 15.0
EVENTS = 500
"""Most decisions one timeline lists."""
_SCAN = 10_000
ALERT_EPISODES_S = 7 * 86400
"""How far back the holds of alert-triggered policies are looked for."""


@router.get("/fleet")
def show_fleet(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.ENGINE_READ))],
    pool: Pool = None,
) -> FleetOut:
    """Every GPU node seen in the last hour with its state (up, down, draining, drained,
    powered_down, booting, unknown), health, GPUs (health, utilization, the job and project
    holding each) and what gpuops holds on it (with the decision that did it and its undo);
    the queue by pool. Stale or missing data is marked so, never shown as healthy."""
    engine = ctx.engine
    now = engine.clock()
    settings = engine.config.prometheus
    max_age = settings.max_sample_age or 2 * settings.scrape_interval
    samples: dict[str, tuple[Sample, ...]] = {}
    errors: list[str] = []
    for name, expr in QUERIES.items():
        try:
            samples[name] = engine.prometheus.query(expr, at=now)
        except QueryError as exc:
            errors.append(str(exc))
            if not samples:  # the first, plainest one: Prometheus is away, ask no more
                errors.append(f"the other {len(QUERIES) - 1} queries were not sent")
                break
    readings = Readings(at=now, max_sample_age_s=max_age, samples=samples, errors=errors)
    return fleet(readings, holds(ctx), pool)


def holds(ctx: ApiContext) -> list[Held]:
    """What gpuops holds now: per policy, each target still in the episode of a fire whose
    action ran (or would have, in dry-run), with that fire's decision and the undo. The fires
    of every acted target are read in one query."""
    engine = ctx.engine
    store = engine.store
    acted: list[tuple[str, str, TargetState, list[str]]] = []
    for name in store.policy_names():
        for key, target in store.policy_state(name).targets.items():
            if target.status is Status.PENDING or not target.acted:
                continue
            ids = [
                decision_id(name, key, target.active_since, Transition.FIRE.value, n)
                for n in range(target.repeats, -1, -1)
            ]
            acted.append((name, key, target, ids))
    stored = store.stored_decisions([i for *_, ids in acted for i in ids])
    found: list[Held] = []
    for name, key, target, ids in acted:
        fire = next((stored[i] for i in ids if i in stored and _ran(stored[i])), None)
        if fire is None:
            continue
        policy = engine.rules.policy(name)
        undo = policy.on_clear.type if policy is not None and policy.on_clear else None
        clearing = None
        if target.status is Status.CLEARING:
            clearing = decision_id(
                name, key, target.active_since, Transition.CLEAR.value, target.repeats
            )
        dry_run = fire.decision.verdict is Verdict.DRY_RUN
        hold = hold_of(fire.decision, dry_run, undo, clearing, fire.outcome)
        found.append(Held(dict(target.labels), hold))
    return found + _alert_holds(ctx)


def _alert_holds(ctx: ApiContext) -> list[Held]:
    """The holds of policies that Alertmanager alone triggers (they keep no evaluation state):
    each episode of the last ``ALERT_EPISODES_S`` whose fire ran and that no resolve ended."""
    engine = ctx.engine
    since = engine.clock() - ALERT_EPISODES_S
    found: list[Held] = []
    for policy in engine.rules.policies():
        if policy.expr is not None or not policy.trigger_alertmanager:
            continue
        undo = policy.on_clear.type if policy.on_clear else None
        ended: set[tuple[str, float]] = set()
        for stored in engine.store.decisions(policy.name, since, _SCAN):  # newest first
            d = stored.decision
            episode = (d.target.key, d.episode_start)
            if d.transition is not Transition.FIRE:
                ended.add(episode)
            elif episode not in ended and _ran(stored):
                ended.add(episode)  # its newest fire that ran
                dry_run = d.verdict is Verdict.DRY_RUN
                hold = hold_of(d, dry_run, undo, None, stored.outcome)
                found.append(Held(dict(d.target.labels), hold))
    return found


def _ran(stored: StoredDecision) -> bool:
    verdict = stored.decision.verdict
    if verdict is Verdict.DRY_RUN:
        return True
    return verdict is Verdict.EXECUTE and stored.outcome is not None and stored.outcome.ok


@router.get("/timeline")
def show_timeline(
    ctx: Ctx,
    _: Annotated[Principal, Depends(require(Permission.DECISIONS_READ))],
    since: Annotated[
        float | None, Query(ge=0, le=1e11, description="Unix seconds; default: an hour ago.")
    ] = None,
    until: Annotated[
        float | None, Query(ge=0, le=1e11, description="Unix seconds; default: now.")
    ] = None,
    pool: Pool = None,
) -> TimelineOut:
    """Decisions and their outcomes from ``since`` to ``until`` (at most 7 days), and the mean
    GPU utilization and the waiting jobs per pool over the same time."""
    engine = ctx.engine
    end = engine.clock() if until is None else until
    start = end - 3600 if since is None else since
    if start >= end:
        raise HTTPException(422, f"since ({start:.0f}) must be before until ({end:.0f})")
    if end - start > MAX_RANGE_S:
        raise HTTPException(422, f"the range is {end - start:.0f} s; at most {MAX_RANGE_S} s")
    step = max(MIN_STEP_S, math.ceil((end - start) / POINTS))
    errors: list[str] = []
    charts: dict[str, list[SeriesOut]] = {}
    for name, expr in (("utilization", UTILIZATION), ("queue", QUEUE)):
        answer: Mapping[float, tuple[Sample, ...]] = {}
        if not errors:  # after a failure Prometheus is likely away: ask no more
            try:
                answer = engine.prometheus.query_range(expr, start, end, step)
            except QueryError as exc:
                errors.append(str(exc))
        charts[name] = _series(answer, pool)
    pools = _pools(ctx, start, end, errors) if pool is not None and not errors else {}
    events: list[EventOut] = []
    truncated = False
    for stored in engine.store.decisions(None, start, _SCAN):
        d = stored.decision
        if d.at > end or (pool is not None and not _in_pool(d.target.labels, pool, pools)):
            continue
        if len(events) >= EVENTS:
            truncated = True
            break
        events.append(_event(d, stored))
    events.reverse()
    return TimelineOut(
        since=start,
        until=end,
        step_s=step,
        pool=pool,
        utilization=charts["utilization"],
        queue=charts["queue"],
        events=events,
        truncated=truncated,
        errors=errors,
    )


def _pools(
    ctx: ApiContext, start: float, end: float, errors: list[str]
) -> dict[tuple[str, str], str]:
    """The pool of each node and GPU seen from ``start`` to ``end``, by ``("node", name)`` and
    ``("uuid", uuid)``: which pool a decision about a node or a GPU belongs to."""
    window = f"{max(1, math.ceil(end - start))}s"
    found: dict[tuple[str, str], str] = {}
    for label, series in (("node", 'up{job="gpu-nodes"}'), ("uuid", "nvml_gpu_up")):
        expr = f"group by ({label}, pool) (last_over_time({series}[{window}]))"
        try:
            samples = ctx.engine.prometheus.query(expr, at=end)
        except QueryError as exc:
            errors.append(str(exc))
            continue
        for s in samples:
            if s.labels.get(label) and s.labels.get("pool"):
                found[(label, s.labels[label])] = s.labels["pool"]
    return found


def _in_pool(labels: Mapping[str, str], pool: str, pools: Mapping[tuple[str, str], str]) -> bool:
    """Whether a decision's target is in ``pool``: its own ``pool`` label, else the pool of its
    node or GPU; a target of no known pool is shown in every pool."""
    known = labels.get("pool") or next(
        (pools[(k, labels[k])] for k in ("node", "uuid") if (k, labels.get(k, "")) in pools),
        None,
    )
    return known is None or known == pool


def _series(answer: Mapping[float, tuple[Sample, ...]], pool: str | None) -> list[SeriesOut]:
    by_name: dict[str, list[PointOut]] = {}
    for at in sorted(answer):
        for s in answer[at]:
            name = s.labels.get("pool", "") or "all"
            if pool is not None and name != pool:
                continue
            by_name.setdefault(name, []).append(PointOut(at=at, value=s.value))
    return [SeriesOut(name=n, points=p) for n, p in sorted(by_name.items())]


def _event(d: Decision, stored: StoredDecision) -> EventOut:
    outcome = stored.outcome
    verb = d.action.type if d.action is not None else None
    stands = state(
        d.verdict,
        has_action=verb is not None,
        started=stored.status is DecisionStatus.STARTED,
        outcome=outcome,
        verb=verb,
    )
    told = ""
    if outcome is not None:
        told = effect(verb, outcome.changed).text if outcome.ok else (outcome.error or "")
    return EventOut(
        id=d.id,
        at=d.at,
        policy=d.policy,
        target=d.target.key,
        transition=d.transition.value,
        verdict=d.verdict.value,
        action=d.action.type if d.action is not None else None,
        outcome=outcome.status.value if outcome is not None else None,
        error=outcome.error if outcome is not None else None,
        state=stands.value,
        effect=told,
        summary=summary(d.annotations),
    )
