"""Executors: the pluggable things that carry out actions.

``base`` holds the Protocol, the two error classes, the registry and the one function that turns
exceptions into Outcomes; one module per executor beside it. Called by ``gpuops.runtime``.
"""

from gpuops.actions.base import (
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
