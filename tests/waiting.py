"""Waiting for a condition with a deadline — the only way tests wait (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "", interval: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail with
    ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")
        time.sleep(interval)
