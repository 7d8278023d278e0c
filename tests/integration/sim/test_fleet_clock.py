"""A fleet whose clock fails stops: its listeners close (no frozen fleet behind a live API) and
`gpuops fleet sim` exits with the error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result

from gpuops.cli import cli
from gpuops.sim.fleet import FleetConfig, FleetSim
from gpuops.sim.fleet.cluster import Cluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


_advance = Cluster.advance


def _broken_clock(self: Cluster, dt: float) -> None:
    """The cluster's own first step (0 s, at construction) passes; the clock's steps fail."""
    if dt > 0:
        raise RuntimeError("no pool can take a job of 8 GPUs")
    _advance(self, dt)


def test_a_failed_clock_closes_every_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=f"{tmp_path}/gpu-nodes.json")
    with FleetSim(config) as sim:
        url = f"{sim.control_url}/api/v1/state"
        node = sim.node_url("node-0")
        assert requests.get(url, timeout=5).status_code == 200
        monkeypatch.setattr(Cluster, "advance", _broken_clock)
        assert sim.failed.wait(10), "the clock's error was not reported"
        assert isinstance(sim.error, RuntimeError)
        for target in (url, node):
            with pytest.raises(requests.ConnectionError):
                requests.get(target, timeout=5)


def test_fleet_sim_exits_with_the_clocks_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Cluster, "advance", _broken_clock)
    results: list[Result] = []
    args = ["fleet", "sim", "--control-port", "0", "--first-node-port", "0", "--nodes", "1"]
    args += ["--sd-file", str(tmp_path / "gpu-nodes.json")]
    runner = threading.Thread(
        target=lambda: results.append(CliRunner().invoke(cli, args)), daemon=True
    )
    runner.start()
    wait_for(lambda: results, timeout=20, what="gpuops fleet sim to exit")
    assert results[0].exit_code == 1
    assert (
        "the fleet's clock stopped: RuntimeError: no pool can take a job of 8 GPUs"
        in results[0].output
    )
