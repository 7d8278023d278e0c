"""``POST /api/v1/alertmanager``: Alertmanager's webhook receiver (payload version 4).

Validates the notification, queues its alerts for ``engine.runtime.alerts.AlertInbox`` and answers
at once; 503 when the queue is full, so Alertmanager retries. Authenticated like every route —
Alertmanager's ``http_config`` sends a bearer token (``authorization``) or ``basic_auth``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException

from engine.api.auth import require
from engine.api.context import ApiContext, api_context
from engine.api.schemas import AlertmanagerPayload, AlertsQueued
from engine.api.tokens import Permission, Principal

router = APIRouter(tags=["alertmanager"])


@router.post("/alertmanager")
def receive_alerts(
    payload: AlertmanagerPayload,
    ctx: Annotated[ApiContext, Depends(api_context)],
    _: Annotated[Principal, Depends(require(Permission.ALERTS_RECEIVE))],
) -> AlertsQueued:
    """Queue the alerts of one notification; firing ones trigger the policies whose
    ``trigger.alertmanager`` labels they carry, resolved ones their ``on_clear``."""
    alerts = [alert.model_dump() for alert in payload.alerts]
    if not ctx.alerts.submit(alerts):
        raise HTTPException(503, "the alert queue is full; Alertmanager will retry")
    return AlertsQueued(queued=len(alerts))
