"""Which nodes are out of service, asked of a real Prometheus with the query docs/health.md
gives for ``health.ladder.pacing.unavailable``: the Slurm exporter's node states joined to
the pool and rack of each node's exporter target, a node whose exporter went down with it
still counted out. While the Slurm exporter's samples stop being fresh (it serves its last
read, with its time), the answer holds instead of counting."""

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
NODES = {
    "n1": ("r1", "idle"),
    "n2": ("r1", "drained"),
    "n3": ("r2", "mixed"),
    "n4": ("r2", "down"),
    "n5": ("r2", "down"),  # its exporter went down with it
}
GONE = "n5"
KUBE_NODES = {"k1": ("z1", 0, 1), "k2": ("z1", 1, 1), "k3": ("z2", 0, 0), "k4": ("z2", 0, 1)}
"""Kubernetes nodes: (zone, cordoned, Ready)."""


def documented_pacing(index: int) -> PacingSettings:
    """The ``pacing`` of docs/health.md's ``index``-th example that sets ``unavailable``."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "unavailable:" in b]
    assert len(found) == 2  # Slurm's, then Kubernetes'
    return PacingSettings(**yaml.safe_load(found[index])["health"]["ladder"]["pacing"])


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


@pytest.fixture
def kube() -> Iterator[Exporter]:
    """kube-state-metrics: each node's cordon, Ready condition and zone label."""
    exporter = Exporter()
    exporter.read_at = time.time
    for node, (zone, cordoned, ready) in KUBE_NODES.items():
        exporter.set("kube_node_spec_unschedulable", {"node": node}, cordoned)
        for status, value in (("true", ready), ("false", 1 - ready), ("unknown", 0)):
            labels = {"node": node, "condition": "Ready", "status": status}
            exporter.set("kube_node_status_condition", labels, value)
        labels = {"node": node, "label_topology_kubernetes_io_zone": zone}
        exporter.set("kube_node_labels", labels, 1)
    yield exporter
    exporter.close()


Found = dict[str, tuple[tuple[str, ...], bool]]


def asked(client: PrometheusClient, expr: str, names: tuple[str, ...]) -> tuple[Found, str]:
    """Each node's ``names`` labels and whether it is out of service, or why they are not
    known (a new reader each time: none reuses an answer)."""
    try:
        nodes = OutOfService(client, expr, max_sample_age=3.0, clock=time.time).nodes()
    except OutagesUnknown as exc:
        return {}, str(exc)
    return {lb["node"]: (tuple(lb[n] for n in names), down) for lb, down in nodes}, ""


def prometheus(tmp_path: Path, jobs: str) -> PrometheusServer:
    prom = PrometheusServer(tmp_path / "prometheus", f"global: {{scrape_interval: 1s}}\n{jobs}")
    prom.start()
    return prom


def test_the_documented_slurm_query_tells_the_nodes_out_of_service_on_fresh_data_only(
    tmp_path: Path, slurm: Exporter, gpus: Exporter
) -> None:
    expr = documented_pacing(0).unavailable
    assert expr is not None
    gone = Exporter()  # the NVML exporter of the node that goes down
    gone.set("nvml_gpu_info", {"uuid": "GPU-5", "gpu": "0"}, 1)
    targets = "\n".join(
        f"      - targets: ['{(gone if n == GONE else gpus).address}']\n"
        f"        labels: {{node: {n}, pool: a, rack: {rack}}}"
        for n, (rack, _) in NODES.items()
    )
    prom = prometheus(
        tmp_path,
        "scrape_configs:\n"
        "  - job_name: slurm\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['{slurm.address}']}}]\n"
        f"  - job_name: gpu-nodes\n    static_configs:\n{targets}\n",
    )
    client = PrometheusClient(prom.url, timeout_s=5.0)
    try:
        names = ("pool", "rack")
        expected = {
            "n1": (("a", "r1"), False),
            "n2": (("a", "r1"), True),  # drained
            "n3": (("a", "r2"), False),
            "n4": (("a", "r2"), True),  # down
            "n5": (("a", "r2"), True),  # down
        }
        found = wait_for(lambda: len(f := asked(client, expr, names)[0]) == 5 and f, 30, "nodes")
        assert found == expected
        gone.close()  # n5's exporter is not scraped any more: its series end
        series = f'nvml_gpu_info{{node="{GONE}"}}'
        wait_for(lambda: not client.query(series), 30, f"the end of {series}")
        assert asked(client, expr, names) == (expected, "")  # n5 still in r2, still out
        stuck = time.time()
        slurm.read_at = lambda: stuck  # slurmctld stops answering; its last read is served
        why = wait_for(lambda: asked(client, expr, names)[1], 30, "the node states to be stale")
        selector = 'gpuops_slurm_node_state{state!~"idle|mixed|allocated|completing"}'
        assert why == (
            f"3 series of {selector} older than 3s ({{instance='{slurm.address}',"
            " job='slurm', node='n2', state='drained'}, {instance="
            f"'{slurm.address}', job='slurm', node='n4', state='down'}}, {{instance="
            f"'{slurm.address}', job='slurm', node='n5', state='down'}})"
        )
    finally:
        prom.stop()
        gone.close()


def test_the_documented_kubernetes_query_tells_the_nodes_out_of_service_on_fresh_data_only(
    tmp_path: Path, kube: Exporter
) -> None:
    expr = documented_pacing(1).unavailable
    assert expr is not None
    prom = prometheus(
        tmp_path,
        "scrape_configs:\n"
        "  - job_name: kube-state-metrics\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['{kube.address}']}}]\n",
    )
    client = PrometheusClient(prom.url, timeout_s=5.0)
    try:
        names = ("zone",)
        found = wait_for(lambda: len(f := asked(client, expr, names)[0]) == 4 and f, 30, "nodes")
        assert found == {
            "k1": (("z1",), False),
            "k2": (("z1",), True),  # cordoned
            "k3": (("z2",), True),  # not Ready
            "k4": (("z2",), False),
        }
        stuck = time.time()
        kube.read_at = lambda: stuck  # kube-state-metrics serves what it read last
        why = wait_for(lambda: asked(client, expr, names)[1], 30, "the node states to be stale")
        assert re.fullmatch(
            r"4 series of kube_node_spec_unschedulable\{\} older than 3s \(.*\)", why
        )
    finally:
        prom.stop()
