"""What the routes share: the engine, the API settings, the users, the quota manager and the
alert worker — one ``ApiContext`` per app (``app.state.api``), built by ``create_app``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from fastapi import Request
from prometheus_client import CollectorRegistry

from engine.api.alerts import AlertWorker
from engine.api.quota import QuotaManager
from engine.api.tokens import TokenStore
from engine.config import ApiSettings
from engine.runtime import Engine

log = logging.getLogger(__name__)


@dataclass
class ApiContext:
    engine: Engine
    settings: ApiSettings
    tokens: TokenStore
    quota: QuotaManager
    alerts: AlertWorker
    registry: CollectorRegistry
    _stop: threading.Event = field(default_factory=threading.Event)
    _ticker: threading.Thread | None = None

    def start(self) -> None:
        """Start the alert worker and the thread that ends quota requests on time."""
        self._stop.clear()
        self.alerts.start()
        self._ticker = threading.Thread(target=self._tick, name="gpuops-quota", daemon=True)
        self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(30)
            self._ticker = None
        self.alerts.stop()

    def _tick(self) -> None:
        while not self._stop.wait(self.settings.quota.check_interval):
            try:
                self.quota.tick()
            except Exception:  # keep ticking: the next tick retries
                log.exception("quota requests check failed")


def api_context(request: Request) -> ApiContext:
    """Route dependency: this app's context."""
    context: ApiContext = request.app.state.api
    return context
