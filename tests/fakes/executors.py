"""Executors of the tests' own, registered in place of the real ones; each is a
``gpuops.actions.base.Executor``, so it is handed to ``tests.builders.build_engine`` (or an
``ExecutorRegistry``) as a real executor is.

``Recorder`` records every decision it runs, in order and from any worker thread; a test can
hold its runs (``gate``), make them fail (``fail``) and choose what each returns (``result``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpuops.actions.results import ExecutorResult
from gpuops.model.decisions import Decision


def _nothing(decision: Decision) -> ExecutorResult:
    return {}


def _no_error(decision: Decision) -> Exception | None:
    return None


class Recorder:
    """Records what it ran (``ran``, thread-safe); sets ``started`` at its first run; blocks each
    run while ``gate`` is clear (it starts set: nothing blocks); raises what ``fail`` returns;
    returns what ``result`` makes of the decision (``{}`` unless given)."""

    verbs: frozenset[str] | None = None
    """Any verb, as the free-form executors (log, webhook, command)."""

    def __init__(
        self, name: str = "log", result: Callable[[Decision], ExecutorResult] = _nothing
    ) -> None:
        self.name = name
        self.ran: list[Decision] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Callable[[Decision], Exception | None] = _no_error
        self.result = result
        self._lock = threading.Lock()

    def run(self, decision: Decision) -> ExecutorResult:
        with self._lock:
            self.ran.append(decision)
        self.started.set()
        assert self.gate.wait(30), f"{self.name}: the test never released its gate"
        error = self.fail(decision)
        if error is not None:
            raise error
        return self.result(decision)

    @property
    def ids(self) -> list[str]:
        """The ids of the decisions it ran, in order."""
        with self._lock:
            return [d.id for d in self.ran]
