"""docs/reference/metrics.md lists every series each part of gpuops serves, and nothing else:
the engine's and the audit trail's (their registries, and the API's alert counter), the NVML
exporter's (its families), the Slurm exporter's (a scrape with Slurm answering nothing) and the
simulated fleet's (a scrape of the case-study fleet)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from gpuops.audit.metrics import AuditMetrics
from gpuops.exporters.nvml.collector import FAMILIES
from gpuops.exporters.slurm.collector import SlurmCollector
from gpuops.runtime.metrics import EngineMetrics
from gpuops.sim.fleet import Cluster
from gpuops.sim.fleet.collectors import FleetCollector, NodeCollector
from gpuops.sim.fleet.fleetfile import load_fleet

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reference" / "metrics.md"
SECTIONS = {
    "engine": "## The engine",
    "nvml": "## The NVML exporter",
    "slurm": "## The Slurm exporter",
    "fleet": "## The simulated fleet",
}


def documented(section: str) -> set[str]:
    text = DOC.read_text()
    start = text.index(SECTIONS[section])
    end = text.find("\n## ", start + 1)
    names: set[str] = set()
    for row in text[start : end if end > 0 else None].splitlines():
        if row.startswith("| `"):
            names |= set(re.findall(r"`([a-z_:]+)`", row.split("|")[1]))
    return names


def served(families: Iterable[Metric]) -> set[str]:
    return {m.name + ("_total" if m.type == "counter" else "") for m in families}


def source_metric_names(folder: str) -> set[str]:
    """Metrics made with prometheus_client's constructors outside the metrics modules."""
    names = set()
    for path in (REPO / "gpuops" / folder).rglob("*.py"):
        for kind, name in re.findall(
            r"\b(Counter|Gauge|Histogram)\(\s*\"([a-z_]+)\"", path.read_text()
        ):
            names.add(name + ("_total" if kind == "Counter" else ""))
    return names


class _SlurmAnswersNothing:
    def nodes(self) -> list[dict[str, Any]]:
        return []

    def jobs(self) -> list[dict[str, Any]]:
        return []


def code(section: str) -> set[str]:
    if section == "engine":
        registry = CollectorRegistry()
        AuditMetrics(registry)
        engine = EngineMetrics.create().registry
        return served([*engine.collect(), *registry.collect()]) | source_metric_names("runtime")
    if section == "nvml":
        return {name for name, _, _ in FAMILIES}
    if section == "slurm":
        return served(SlurmCollector(_SlurmAnswersNothing()).collect())  # type: ignore[arg-type]
    cluster = Cluster(load_fleet(REPO / "examples" / "fleets" / "case-study.yaml"))
    node = next(iter(cluster.nodes))
    return served(
        [*FleetCollector(cluster).collect(), *NodeCollector(cluster, node, "x").collect()]
    )


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_the_metrics_reference_lists_what_is_served(section: str) -> None:
    listed, actual = documented(section), code(section)
    assert not actual - listed, (
        f"served, not in docs/reference/metrics.md: {sorted(actual - listed)}"
    )
    assert not listed - actual, (
        f"in docs/reference/metrics.md, not served: {sorted(listed - actual)}"
    )
