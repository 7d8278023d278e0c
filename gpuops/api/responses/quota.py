"""The answers of ``/api/v1/quota-requests`` and ``/api/v1/quota-projects``: one request,
every field of the engine's ``QuotaRequest``, the list, and each project's quota and usage.
Built by ``gpuops.api.routes.quota``.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from gpuops.api.responses import Number, Out
from gpuops.runtime.quota import ProjectQuota
from gpuops.store.interface import QuotaRequest, QuotaStatus


class QuotaRequestOut(Out):
    """An elastic quota request: N more GPUs for a project for a while."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    project: str
    gpus: int
    duration_s: Number
    reason: str
    requested_by: str
    requested_at: Number
    expires_at: Number = Field(description="Until when an admin can approve it.")
    status: QuotaStatus
    nodes: int
    pool: str
    decided_by: str | None
    decided_at: Number | None
    starts_at: Number | None
    ends_at: Number | None
    grant_decision: str | None
    undo_decision: str | None
    error: str | None
    release_attempts: int
    apply_attempts: int
    retry_at: Number | None = Field(description="When a held grant is decided again.")

    @classmethod
    def of(cls, request: QuotaRequest) -> QuotaRequestOut:
        return cls.model_validate(request)


class QuotaRequestsOut(Out):
    requests: list[QuotaRequestOut]


class ProjectQuotaOut(Out):
    """One project's quota now."""

    name: str
    base: int | None = Field(description="GPUs without a request (api.quota.projects).")
    granted: int = Field(description="GPUs its active grants add now.")
    quota: int | None = Field(description="base + granted (None: no base configured).")
    usage: Number | None = Field(description="GPUs its jobs hold now (None: not known).")
    pending: int = Field(description="Its requests waiting for an admin.")

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, project: ProjectQuota) -> ProjectQuotaOut:
        return cls.model_validate(project)


class ProjectsOut(Out):
    projects: list[ProjectQuotaOut]
    usage_error: str | None = Field(
        description="Why usage is not known (the query failed), None when it is or is not asked."
    )
