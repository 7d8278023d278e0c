"""The fleet what-if dashboard against a real Prometheus scraping a fleet-file fleet: every
panel's query is accepted and returns data (the checks of ``test_grafana_queries``), on the
seed's case-study fleet run fast enough that jobs arrive, finish and prices change."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuops.sim.fleet import FleetSim, JobSpec
from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sources.promproc import PrometheusServer
from tests.integration.deploy.test_grafana_queries import (
    DASHBOARD_DIR,
    load_dashboards,
    prometheus_queries,
    provisioned_datasources,
    query_problems,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
NAME = "fleet-whatif.json"


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("whatif-prom")
    config = replace(
        load_fleet(REPO / "examples" / "fleets" / "case-study.yaml"),
        speed=600.0,  # ten simulated minutes per second
        sd_file=str(workdir / "gpu-nodes.json"),
    )
    with FleetSim(config) as fleet:
        fleet.cluster.submit(JobSpec("training", 2, "ai-rnd", pool="", priority_class="high"))
        prom_config = "global:\n  scrape_interval: 1s\n" + fleet.scrape_config("1s")
        with PrometheusServer(workdir / "prom", prom_config) as prom:
            yield prom.url


def test_the_whatif_dashboard_is_in_the_provisioned_folder() -> None:
    assert (DASHBOARD_DIR / NAME).exists()
    assert load_dashboards()[NAME]["uid"] == "gpuops-fleet-whatif"


def test_every_whatif_query_returns_data(prom_url: str) -> None:
    known = provisioned_datasources()
    dashboard = load_dashboards()[NAME]
    queries = prometheus_queries(NAME, dashboard, known)
    exprs = " ".join(q.expr for q in queries)
    for series in (
        "gpuops_electricity_price_per_kwh",
        "gpuops_fleet_power_watts",
        "gpuops_queue_pending_class_jobs",
        "nvml_gpu_utilization_ratio",
    ):
        assert series in exprs
    assert query_problems(prom_url, NAME, dashboard, known, need_data=True) == []
