"""A running simulated fleet on free loopback ports, with background arrivals off."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from exporters.fleet import FleetConfig, FleetSim


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.05)


@pytest.fixture
def fleet(tmp_path: object) -> Iterator[FleetSim]:
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=f"{tmp_path}/gpu-nodes.json")
    with FleetSim(config) as sim:
        yield sim
