"""Executors: the pluggable things that carry out actions.

``base`` holds the Protocol, the two error classes and the one function that turns exceptions
into Outcomes (``retry``: how it retries); ``registry`` the executors by name (entry points), what
they do and take; ``dispatch`` the table that routes each verb an executor implements
(``gpuops.model.verbs``) to its handler with typed params; ``results`` the typed results and
their JSON form; ``config`` how an executor reads its settings; ``encoding`` label values into
URLs, headers and log lines. One module per executor beside them (``fleet``, ``slurm``,
``nvml_agent``, ``webhook``, ``command``, ``log``; ``logical``: ``scheduler`` and
``gpu-control``). Called by ``gpuops.runtime.gate``; checked against by ``gpuops.offline``.
"""

from gpuops.actions.base import (
    Executor,
    ExecutorError,
    PermanentError,
    TemporaryError,
    execute,
)
from gpuops.actions.registry import ExecutorRegistry

__all__ = [
    "Executor",
    "ExecutorError",
    "ExecutorRegistry",
    "PermanentError",
    "TemporaryError",
    "execute",
]
