"""What the routes share: the engine, the API settings, the users, the quota manager and the
alert inbox — one ``ApiContext`` per app (``app.state.api``), built by ``create_app``. The quota
manager and the alert inbox are the engine's collaborators (their threads are the engine's,
so quota grants end and alerts are handled also without the API).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from prometheus_client import CollectorRegistry

from gpuops.api.tokens import TokenStore
from gpuops.runtime import Engine
from gpuops.runtime.alerts import AlertInbox
from gpuops.runtime.leadership import NotLeaderError as NotLeaderError  # for the console
from gpuops.runtime.quota import QuotaManager
from gpuops.settings import ApiSettings


@dataclass
class ApiContext:
    engine: Engine
    settings: ApiSettings
    tokens: TokenStore
    registry: CollectorRegistry

    @property
    def quota(self) -> QuotaManager:
        return self.engine.quota

    @property
    def alerts(self) -> AlertInbox:
        return self.engine.alerts


def api_context(request: Request) -> ApiContext:
    """Route dependency: this app's context."""
    context: ApiContext = request.app.state.api
    return context
