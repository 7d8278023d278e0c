"""Prometheus durations: the accepted grammar, its rejections, and formatting back."""

from __future__ import annotations

import pytest

from gpuops.model.rules.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("500ms", 0.5),
        ("2w", 14 * 86400.0),
        ("1y", 365 * 86400.0),
        ("1m30s250ms", 90.25),
        ("0", 0.0),
        ("0s", 0.0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "10 minutes", "5", "1.5h", "5m1h", "ms", "-1s", "1s1s", " 5m", "5M", "1h 30m"]
)
def test_reject(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (30.0, "30s"),
        (90.0, "1m30s"),
        (5400.0, "1h30m"),
        (0.5, "500ms"),
        (86400.0, "1d"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
