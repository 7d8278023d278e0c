"""The engine's switches and locks, shared by the facade, the cycle, the gate and the
collaborators (approvals, quota, alert inbox): the kill switch (state file or a file on disk),
pause, and one lock order — a policy's lock, then the engine's.

Built by ``engine.runtime.facade.Engine``; read by ``engine.runtime.gate`` at the moment of
execution and by the judge step at decision time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from engine.config import GuardrailSettings
from engine.metrics import EngineMetrics
from engine.store import ControlRepository

log = logging.getLogger(__name__)

CONTROLS = ("kill_switch", "paused")


class Controls:
    """Kill switch and pause, persisted in the state file (they survive a restart)."""

    def __init__(
        self,
        store: ControlRepository,
        settings: GuardrailSettings,
        metrics: EngineMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._clock = clock

    def kill_switch_on(self) -> bool:
        f = self._settings.kill_switch_file
        return self._store.control("kill_switch") is not None or bool(f and f.exists())

    def paused(self) -> bool:
        return self._store.control("paused") is not None

    def set(self, name: str, on: bool, user: str) -> None:
        """Turn ``kill_switch`` or ``paused`` on or off."""
        if name not in CONTROLS:
            raise ValueError(f"unknown control {name!r} (known: {', '.join(CONTROLS)})")
        self._store.set_control(name, f"{user}@{self._clock():.0f}" if on else None)
        gauge = self._metrics.kill_switch if name == "kill_switch" else self._metrics.paused
        gauge.set(1 if on else 0)
        log.warning("%s turned %s by %s", name, "on" if on else "off", user)


class Locks:
    """One writer of a policy's state at a time (``policy``), one judgement of the shared
    guardrail windows at a time (``engine``). Order everywhere: the policy's, then the engine's."""

    def __init__(self) -> None:
        self.engine = threading.RLock()
        self._policies: dict[str, threading.Lock] = {}

    def policy(self, name: str) -> threading.Lock:
        with self.engine:
            return self._policies.setdefault(name, threading.Lock())
