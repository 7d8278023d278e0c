"""The answer of ``/api/v1/audit``: audit documents as the audit trail holds them. Built by
``gpuops.api.routes.audit``.
"""

from __future__ import annotations

from pydantic import Field

from gpuops.api.responses import JsonObject, Out


class AuditSearchOut(Out):
    documents: list[JsonObject] = Field(
        description="ECS documents as stored (docs/reference/audit.md), newest first: "
        "decisions and outcomes (data_stream.dataset gpuops.decision) and user operations "
        "(gpuops.audit)."
    )
    count: int
