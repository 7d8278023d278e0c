"""A running simulated fleet on free loopback ports, with background arrivals off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuops.sim.fleet import FleetConfig, FleetSim, PoolSpec
from gpuops.sim.fleet.workload import PriorityClass


@pytest.fixture
def fleet(tmp_path: object) -> Iterator[FleetSim]:
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=f"{tmp_path}/gpu-nodes.json")
    with FleetSim(config) as sim:
        yield sim


def quiet_sim(
    tmp_path: object, pools: tuple[PoolSpec, ...], classes: tuple[PriorityClass, ...]
) -> FleetSim:
    """A fleet of ``pools`` with no jobs and no arrivals (enter it to start it)."""
    config = FleetConfig(
        pools=pools,
        arrival_rate_per_min=0.0,
        initial_jobs=(),
        sd_file=f"{tmp_path}/gpu-nodes.json",
        priority_classes=classes,
    )
    return FleetSim(config)
