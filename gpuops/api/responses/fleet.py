"""The answers of ``/api/v1/fleet`` (the nodes and GPUs now, with what gpuops holds on each)
and ``/api/v1/timeline`` (decisions and outcomes over time, with utilization and queue length).
Built by ``gpuops.api.fleetview`` (the fleet's state derived from Prometheus' series and the
engine's holds) and ``gpuops.api.routes.fleet``; the console's Fleet and Timeline pages show
them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuops.api.responses import Number, Out

NodeState = Literal["up", "down", "draining", "drained", "powered_down", "booting", "unknown"]
"""A node's state: Slurm's node state when the Slurm exporter serves it, else the scrape of the
node (``up``) and the simulated fleet's ``gpuops_node_booting`` and
``gpuops_node_powered_down``; ``unknown`` when no series about the node is fresh."""

Health = Literal["ok", "degraded", "failed", "no_data"]


class HoldOut(Out):
    """Something gpuops did that still stands: the fire of a policy whose episode goes on."""

    what: str = Field(description="In words: drained, downclocked, reclaimed, scaled out, ...")
    policy: str
    action: str = Field(description="The verb that ran.")
    decision_id: str
    at: Number = Field(description="When the decision that did it was made (Unix seconds).")
    dry_run: bool = Field(description="Only recorded: the action would have run.")
    undo: str | None = Field(description="The verb that undoes it when the condition clears.")
    undo_decision_id: str | None = Field(
        description="The undo's decision, while the guardrails hold it back."
    )
    target: str = Field(description="The target's key.")
    effect: str = Field(description="What the action changed, in words (dry-run: nothing).")


class GpuOut(Out):
    uuid: str
    index: str = Field(description="The NVML index (``gpu`` label).")
    up: bool | None = Field(description="Answers NVML; None: no fresh reading.")
    health: Health
    problems: list[str] = Field(description="Why the health is not ok, in words.")
    utilization: Number | None = Field(description="0-1; None: no fresh reading.")
    temperature_c: Number | None
    job: str | None = Field(description="The job holding the GPU.")
    project: str | None
    last_seen: Number | None = Field(description="The newest sample about the GPU.")
    stale: bool = Field(description="No sample newer than the engine's freshness bound.")
    holds: list[HoldOut]


class NodeOut(Out):
    name: str
    pool: str
    state: NodeState
    state_source: str = Field(description="The series the state was read from.")
    health: Health
    problems: list[str]
    last_seen: Number | None = Field(description="The node's newest scrape (``up``) sample.")
    stale: bool
    gpus: list[GpuOut]
    holds: list[HoldOut] = Field(description="Holds on the node itself (drained, ...).")
    attention: bool = Field(
        description="Not up, not healthy, or gpuops holds something on it or on a GPU."
    )


class QueueOut(Out):
    pool: str
    pending_jobs: Number
    reasons: dict[str, Number] = Field(description="Waiting jobs by the scheduler's reason.")


class FleetOut(Out):
    at: Number = Field(description="When Prometheus was asked (Unix seconds).")
    max_sample_age_s: Number = Field(description="Older samples are stale (never healthy).")
    pool: str | None = Field(description="The pool filter; None: every pool.")
    pools: list[str] = Field(description="Every pool seen, for the filter.")
    nodes: list[NodeOut]
    queue: list[QueueOut]
    pending_jobs: Number | None = Field(description="Waiting jobs in the shown pools.")
    other_holds: list[HoldOut] = Field(
        description="Holds on targets that are no node or GPU shown (a pool, a class, ...)."
    )
    errors: list[str] = Field(description="Queries Prometheus did not answer: data missing.")


class PointOut(Out):
    at: Number
    value: Number


class SeriesOut(Out):
    name: str = Field(description="The pool (or ``all``).")
    points: list[PointOut] = Field(description="Steps without a sample are left out (a gap).")


class EventOut(Out):
    """A decision on the timeline."""

    id: str
    at: Number
    policy: str
    target: str
    transition: str
    verdict: str
    action: str | None
    outcome: str | None = Field(description="success, failure, skipped; None: not run (yet).")
    error: str | None
    state: str = Field(
        description="Where it stands: waiting for approval, held, dry run, running, done, no "
        "effect (it ran and changed nothing its verb promises), failed, recorded."
    )
    effect: str = Field(description="What its action changed (or why it failed), in words.")
    summary: str = Field(description="The policy's own summary of it.")


class TimelineOut(Out):
    since: Number
    until: Number
    step_s: Number
    pool: str | None
    utilization: list[SeriesOut] = Field(description="Mean GPU utilization (0-1) per pool.")
    queue: list[SeriesOut] = Field(description="Waiting jobs per pool.")
    events: list[EventOut] = Field(description="Decisions in the range, oldest first.")
    truncated: bool = Field(description="More decisions than shown fell in the range.")
    errors: list[str]
