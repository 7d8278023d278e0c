"""``POST /api/v1/alertmanager``: Alertmanager's webhook receiver (payload version 4).

Validates the notification (``gpuops.api.schemas.AlertmanagerPayload``), hands its alerts as
frozen values (``gpuops.model.alerts.Alert``) to ``gpuops.runtime.alerts.AlertInbox`` and answers
at once. Whenever the engine cannot take the notification now — the inbox has no room for it
yet, the state database cannot store it — the answer is 503 with the reason, which Alertmanager
retries (it drops a notification answered 4xx). Authenticated like every route — Alertmanager's
``http_config`` sends a bearer token (``authorization``) or ``basic_auth``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException

from gpuops.api.auth import require
from gpuops.api.context import ApiContext, api_context
from gpuops.api.schemas import AlertmanagerPayload, AlertsQueued
from gpuops.api.tokens import Permission, Principal
from gpuops.runtime.alerts import InboxFull
from gpuops.store.errors import StateError

router = APIRouter(tags=["alertmanager"])


@router.post("/alertmanager")
def receive_alerts(
    payload: AlertmanagerPayload,
    ctx: Annotated[ApiContext, Depends(api_context)],
    _: Annotated[Principal, Depends(require(Permission.ALERTS_RECEIVE))],
) -> AlertsQueued:
    """Queue the alerts of one notification; firing ones trigger the policies whose
    ``trigger.alertmanager`` labels they carry, resolved ones their ``on_clear``."""
    alerts = [alert.value() for alert in payload.alerts]
    try:
        ctx.alerts.submit(alerts)
    except InboxFull as exc:
        raise HTTPException(503, str(exc)) from None
    except StateError as exc:
        why = f"the alert inbox cannot store the notification now: {exc}"
        raise HTTPException(503, f"{why}; Alertmanager will retry") from None
    return AlertsQueued(queued=len(alerts))
