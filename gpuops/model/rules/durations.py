"""Prometheus durations (``30s``, ``5m``, ``1h30m``, ``1d``, ``500ms``) to seconds and back.

Used by ``gpuops.model.rules.schema`` to validate policy fields and by
``gpuops.model.rules.export`` to write
them into a Prometheus rule file. The grammar is Prometheus' own: unit-suffixed integers, units
from largest to smallest, each at most once; a bare ``0`` is allowed.
"""

from __future__ import annotations

import re

_UNITS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)
_PATTERN = re.compile("".join(rf"(?:(?P<{u}>\d+){u})?" for u, _ in _UNITS))


class DurationError(ValueError):
    """Text that is not a Prometheus duration."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration; raises ``DurationError`` for anything else."""
    if text == "0":
        return 0.0
    match = _PATTERN.fullmatch(text)
    if not text or match is None:
        raise DurationError(f"invalid duration {text!r}")
    return sum(int(match.group(u)) * factor for u, factor in _UNITS if match.group(u) is not None)


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for ``seconds`` (rounded to milliseconds)."""
    millis = round(seconds * 1000)
    if millis <= 0:
        return "0s"
    parts = []
    for unit, factor in _UNITS:
        size = round(factor * 1000)
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
