"""A what-if writes only the series its rules read (``VirtualFleet(names=...)``): the same
samples as a fleet that writes everything, for those names, and nothing else."""

from __future__ import annotations

from pathlib import Path

from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sim.fleet.virtual import VirtualFleet

REPO = Path(__file__).resolve().parents[4]


def _names(last: dict[tuple[tuple[str, str], ...], float]) -> set[str]:
    return {dict(labels)["__name__"] for labels in last}


def test_only_the_named_series_are_written_with_the_values_of_every_series() -> None:
    config = load_fleet(REPO / "examples" / "fleets" / "case-study.yaml")
    names = frozenset(
        {"up", "nvml_gpu_utilization_ratio", "nvml_gpu_energy_joules_total"}
        | {"gpuops_gpu_allocated", "gpuops_electricity_price_per_kwh", "no_such_metric"}
    )
    every = VirtualFleet(config, 0, scrape_interval_s=30.0)
    some = VirtualFleet(config, 0, scrape_interval_s=30.0, names=names)
    for t in (0.0, 600.0):
        every.run_until(t)
        some.run_until(t)
        full, kept = every.last, some.last
        assert _names(kept) == names - {"no_such_metric"}
        assert kept == {k: v for k, v in full.items() if dict(k)["__name__"] in names}
        gpus = sum(len(n.gpus) for n in some.cluster.nodes.values())
        utilization = [k for k in kept if dict(k)["__name__"] == "nvml_gpu_utilization_ratio"]
        assert len(utilization) == gpus
    assert _names(every.last) > _names(some.last)  # the rest was there to leave out
    assert len(some.series.labels) < len(every.series.labels) / 5
