"""How an action's temporary failures are retried: a value the engine is configured with and
hands to the gate, which retries through ``gpuops.actions.base.execute``. Its own module so that
the engine's facade names it without importing what runs executors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How temporary failures are retried."""

    attempts: int = 3
    """Total tries, the first included."""
    backoff_s: float = 0.5
    """Delay before the second try; doubled for each further one."""
    max_backoff_s: float = 10.0
