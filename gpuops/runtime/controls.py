"""The engine's switches and locks, shared by the facade, the cycle, the gate and the
collaborators (approvals, quota, alert inbox): the kill switch (state file or a file on disk),
pause, and one lock order — a policy's lock, then the engine's.

Built by ``gpuops.runtime.facade.Engine``; read by ``gpuops.runtime.gate`` at the moment of
execution and by the judge step at decision time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings
from gpuops.store.interface import ControlRepository

log = logging.getLogger(__name__)

CONTROLS = ("kill_switch", "paused")

STORED_MAX_AGE_S = 1.0
"""How long a read of the stored kill switch and pause is reused. One set through ``set`` (the
API, the CLI through the API) is seen by the very next action; one written to the database by
another process (an offline ``gpuops`` command, another replica) within this long. The kill
switch file is looked at on every call."""


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
        self._lock = threading.Lock()
        self._snapshot: tuple[float, bool, bool] | None = None  # (monotonic read time, ...)
        self._generation = 0  # of ``set`` calls: a read that raced one is not kept

    def kill_switch_on(self) -> bool:
        f = self._settings.kill_switch_file
        return self._stored()[0] or bool(f and f.exists())

    def paused(self) -> bool:
        return self._stored()[1]

    def _stored(self) -> tuple[bool, bool]:
        """The stored kill switch and pause, read at most every ``STORED_MAX_AGE_S`` (the gate
        asks before every action and between its tries; the file is looked at every time)."""
        now = time.monotonic()
        with self._lock:
            snapshot, generation = self._snapshot, self._generation
        if snapshot is not None and now - snapshot[0] < STORED_MAX_AGE_S:
            return snapshot[1], snapshot[2]
        kill = self._store.control("kill_switch") is not None
        paused = self._store.control("paused") is not None
        with self._lock:
            if self._generation == generation:  # no ``set`` meanwhile: the read is current
                self._snapshot = (now, kill, paused)
        return kill, paused

    def set(self, name: str, on: bool, user: str) -> None:
        """Turn ``kill_switch`` or ``paused`` on or off."""
        if name not in CONTROLS:
            raise ValueError(f"unknown control {name!r} (known: {', '.join(CONTROLS)})")
        try:
            self._store.set_control(name, f"{user}@{self._clock():.0f}" if on else None)
        finally:  # the next action reads it again (even when the write's result is unknown)
            with self._lock:
                self._generation += 1
                self._snapshot = None
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
