"""A running simulated fleet on free loopback ports, with background arrivals off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporters.fleet import FleetConfig, FleetSim


@pytest.fixture
def fleet(tmp_path: object) -> Iterator[FleetSim]:
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=f"{tmp_path}/gpu-nodes.json")
    with FleetSim(config) as sim:
        yield sim
