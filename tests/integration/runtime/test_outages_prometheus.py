"""Which nodes are out of service, asked of a real Prometheus with the query docs/health.md
gives for ``health.ladder.pacing.unavailable``: the Slurm exporter's node states joined to
the pool and rack of each node's exporter target. While the Slurm exporter's samples stop
being fresh (it serves its last read, with its time), the answer holds instead of counting."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuops.runtime.outages import OutagesUnknown, OutOfService
from gpuops.settings import PacingSettings
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promproc import PrometheusServer
from tests.fakes.exposition import Exporter
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

DOCS = Path(__file__).parents[3] / "docs" / "health.md"
NODES = {"n1": ("r1", "idle"), "n2": ("r1", "drained"), "n3": ("r2", "mixed"), "n4": ("r2", "down")}


def documented_pacing() -> PacingSettings:
    """The ``pacing`` of docs/health.md's example that sets ``unavailable``."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "unavailable:" in b]
    return PacingSettings(**yaml.safe_load(block)["health"]["ladder"]["pacing"])


@pytest.fixture
def slurm() -> Iterator[Exporter]:
    """The Slurm exporter's node states, stamped with the time it read them."""
    exporter = Exporter()
    exporter.read_at = time.time
    for node, (_, state) in NODES.items():
        exporter.set("gpuops_slurm_node_state", {"node": node, "state": state}, 1)
    yield exporter
    exporter.close()


@pytest.fixture
def gpus() -> Iterator[Exporter]:
    """A node's NVML exporter (the same one for every node: its target labels tell them
    apart)."""
    exporter = Exporter()
    exporter.set("nvml_gpu_info", {"uuid": "GPU-0", "gpu": "0"}, 1)
    yield exporter
    exporter.close()


def test_the_documented_query_tells_the_nodes_out_of_service_on_fresh_data_only(
    tmp_path: Path, slurm: Exporter, gpus: Exporter
) -> None:
    pacing = documented_pacing()
    assert pacing.unavailable is not None
    targets = "\n".join(
        f"      - targets: ['{gpus.address}']\n        labels: {{node: {n}, pool: a, rack: {rack}}}"
        for n, (rack, _) in NODES.items()
    )
    config = (
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: slurm\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['{slurm.address}']}}]\n"
        "  - job_name: gpu-nodes\n    static_configs:\n"
        f"{targets}\n"
    )
    prom = PrometheusServer(tmp_path / "prometheus", config)
    prom.start()
    client = PrometheusClient(prom.url, timeout_s=5.0)
    expr = pacing.unavailable
    try:

        def asked() -> tuple[dict[str, tuple[str, str, bool]], str]:
            """Each node's (pool, rack, out of service), or why they are not known (a new
            reader each time: none reuses an answer)."""
            try:
                nodes = OutOfService(client, expr, max_sample_age=3.0, clock=time.time).nodes()
            except OutagesUnknown as exc:
                return {}, str(exc)
            return {lb["node"]: (lb["pool"], lb["rack"], down) for lb, down in nodes}, ""

        found = wait_for(lambda: len(asked()[0]) == len(NODES) and asked()[0], 30, "the nodes")
        assert found == {
            "n1": ("a", "r1", False),
            "n2": ("a", "r1", True),  # drained
            "n3": ("a", "r2", False),
            "n4": ("a", "r2", True),  # down
        }
        stuck = time.time()
        slurm.read_at = lambda: stuck  # slurmctld stops answering; its last read is served
        why = wait_for(lambda: asked()[1], 30, "the node states to grow stale")
        assert asked()[0] == {}
        selector = 'gpuops_slurm_node_state{state!~"idle|mixed|allocated|completing"}'
        assert why == (
            f"2 series of {selector} older than 3s ({{instance='{slurm.address}',"
            " job='slurm', node='n2', state='drained'}, {instance="
            f"'{slurm.address}', job='slurm', node='n4', state='down'}})"
        )
    finally:
        prom.stop()
