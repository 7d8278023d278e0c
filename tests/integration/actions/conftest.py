"""Fixtures for the executor tests: a scripted HTTP receiver, closed after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.fakes.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(secret: bytes | None = None) -> Receiver:
        started.append(Receiver(secret))
        return started[-1]

    yield start
    for r in started:
        r.close()
