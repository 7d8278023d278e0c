"""An Alertmanager alert as the engine handles it: one ``alerts[]`` item of a webhook
notification (payload version 4), frozen.

Built by the receiver (``gpuops.api.routes.alertmanager``) from the validated payload, queued by
the alert inbox (``gpuops.runtime.alerts``), kept in the state store's inbox and early-resolve
rows (``gpuops.store.codecs.alert_doc``: JSON only there), and decided by the inbox's worker or
``gpuops.runtime.facade.Engine.handle_alert`` (``gpuops.runtime.alerts.deciding``: a decision
per policy it triggers, ``gpuops.model.evaluation.alertmanager.evaluate_alert``). Imports
nothing of the engine but ``gpuops.model.decisions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from gpuops.model.decisions import EMPTY


class AlertStatus(StrEnum):
    """Alertmanager's status of an alert: firing runs a policy's ``action``, resolved its
    ``on_clear``."""

    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class Alert:
    """One alert of a notification. ``fingerprint``, ``starts_at`` and ``status`` make a
    notification of it the same one again (a retried webhook, a resend); ``starts_at`` also
    starts its episode (the decision ids of what it triggers)."""

    fingerprint: str
    """Alertmanager's identity of the alert (a hash of its labels)."""
    status: AlertStatus
    labels: Mapping[str, str]
    """Read-only; ``alertname`` and the labels a policy's ``trigger.alertmanager`` matches."""
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    starts_at: str = ""
    """``startsAt`` as Alertmanager sent it (RFC 3339): compared as text, read as a time by
    ``episode_start``."""
    ends_at: str = ""
    """``endsAt`` as sent (Alertmanager's zero time while it fires)."""
    generator_url: str = ""
    """``generatorURL``: the expression's page in the Prometheus that raised it."""

    @property
    def firing(self) -> bool:
        return self.status is AlertStatus.FIRING

    @property
    def name(self) -> str:
        """Its ``alertname`` label (``?`` without one), for log lines."""
        return self.labels.get("alertname", "?")

    def episode_start(self) -> float | None:
        """``starts_at`` in seconds since the epoch; None when it is not an RFC 3339 time."""
        try:
            return datetime.fromisoformat(self.starts_at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
