"""The answers about batch operations (``/api/v1/batch``): each operation's status and where
each of its nodes is. Built by ``gpuops.api.routes.batch`` from the engine's batch runner.
"""

from __future__ import annotations

from pydantic import Field

from gpuops.api.responses import Out


class BatchNodeOut(Out):
    name: str
    status: str = Field(description="pending, running, done, failed, skipped or cancelled.")
    wave: int = Field(description="The wave it went in (-1: not yet).")
    done: list[str] = Field(description="The steps it finished, in order.")
    error: str = Field(description="Why it failed or was skipped (empty: nothing to say).")
    was_out: bool = Field(description="Out of service before the operation: it stays so.")


class BatchRefusedOut(Out):
    """422: the operation cannot run; nothing was stored."""

    detail: str
    errors: list[str] = Field(
        description="Each problem: FILE:LINE: field: what (the file), or FILE: field: what"
        " (the plan over the fleet)."
    )


class BatchOut(Out):
    id: str
    status: str = Field(
        description="awaiting_approval, running, paused (why says why), done or cancelled."
    )
    started_by: str = Field(description="Who started it (empty: not known).")
    why: str = Field(description="Why it paused, or its failed nodes once done.")
    waves: int
    created_at: float
    timeline: list[list[float]] = Field(
        description="[at, wave, nodes out of service] as each wave started."
    )
    nodes: list[BatchNodeOut]
