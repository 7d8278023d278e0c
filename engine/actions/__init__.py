"""Executors: the pluggable things that carry out actions (DESIGN.md section 7).

``base`` holds the Protocol, the two error classes, the registry and the one function that turns
exceptions into Outcomes; one module per executor beside it. Called by ``engine.runtime``.
"""

from engine.actions.base import (
    Executor,
    ExecutorError,
    ExecutorRegistry,
    PermanentError,
    TemporaryError,
    execute,
)

__all__ = [
    "Executor",
    "ExecutorError",
    "ExecutorRegistry",
    "PermanentError",
    "TemporaryError",
    "execute",
]
