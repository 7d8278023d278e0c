"""The Slurm exporter against a real slurmctld: queue, node states, GPU allocations by minor
number, and "Slurm unreachable" as a metric instead of an empty queue."""

from __future__ import annotations

import subprocess

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuops.exporters.slurm.server import SlurmExporter
from gpuops.integrations.slurm.client import SlurmClient
from gpuops.integrations.slurm.gres import minor_numbers
from gpuops.sim.slurmcluster import SlurmCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[str, Samples]:
    text = requests.get(f"{url}/metrics", timeout=30).text
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_queue_nodes_and_gpus_by_minor_number(slurm: SlurmCluster) -> None:
    client = SlurmClient(conf=str(slurm.conf), timeout_s=10)
    exporter = SlurmExporter(
        client, host="127.0.0.1", port=0, gres_minors=minor_numbers(slurm.gres_conf, client)
    ).start()
    try:
        running = slurm.submit(
            "--gres=gpu:1", "-w", "gpu-b", "-o", "/dev/null", "--wrap", "sleep 60"
        )
        held = slurm.submit("--hold", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "true")
        wait_for(
            lambda: value(scrape(exporter.url)[1], "slurm_queue_running") == 1.0,
            20,
            "the GPU job to run",
        )
        text, s = scrape(exporter.url)
        assert value(s, "gpuops_slurm_up") == 1.0
        # gpu-b's GPUs are /dev/nvidia2 and 3: GRES index 0 is minor number 2.
        alloc = {
            "node": "gpu-b",
            "minor_number": "2",
            "job": running,
            "user": "root",
            "account": "",
            "project": "",
            "partition": "gpu",
        }
        assert value(s, "gpuops_slurm_gpu_allocated", **alloc) == 1.0
        assert sum(1 for (n, _) in s if n == "gpuops_slurm_gpu_allocated") == 1
        assert value(s, "gpuops_queue_pending_jobs", pool="gpu", reason="JobHeldUser") == 1.0
        assert value(s, "gpuops_queue_pending_gpus", pool="gpu", reason="JobHeldUser") == 2.0
        assert value(s, "slurm_queue_pending") == 1.0
        assert value(s, "gpuops_slurm_node_state", node="gpu-b", state="mixed") == 1.0
        assert value(s, "gpuops_slurm_node_state", node="gpu-a", state="idle") == 1.0
        assert value(s, "gpuops_slurm_node_state", node="cloud-1", state="powered_down") == 1.0
        assert value(s, "gpuops_slurm_nodes", pool="gpu", state="powered_down") == 1.0
        assert value(s, "slurm_nodes_idle") == 1.0 and value(s, "slurm_nodes_mix") == 1.0
        # The powered-down cloud node's GPUs are not capacity.
        assert value(s, "slurm_gpus_total") == 4.0
        assert value(s, "slurm_gpus_alloc") == 1.0
        assert value(s, "slurm_gpus_idle") == 3.0
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
        )
        # The one finding is the name prometheus-slurm-exporter chose (kept for its dashboards).
        findings = [line for line in check.stderr.splitlines() if line.strip()]
        assert findings == [
            'slurm_gpus_total non-counter metrics should not have "_total" suffix'
        ], check.stderr
        assert held
    finally:
        exporter.stop()


def test_empty_queue_is_an_explicit_zero(slurm: SlurmCluster) -> None:
    exporter = SlurmExporter(SlurmClient(conf=str(slurm.conf)), host="127.0.0.1", port=0).start()
    try:
        _, s = scrape(exporter.url)
        assert value(s, "gpuops_slurm_up") == 1.0
        assert value(s, "gpuops_queue_pending_jobs", pool="gpu", reason="") == 0.0
    finally:
        exporter.stop()


def test_unreachable_slurm_is_reported_never_read_as_an_empty_queue(slurm: SlurmCluster) -> None:
    exporter = SlurmExporter(
        SlurmClient(conf=str(slurm.conf), timeout_s=2), host="127.0.0.1", port=0
    ).start()
    try:
        slurm.stop_controller()
        _, s = scrape(exporter.url)
        assert value(s, "gpuops_slurm_up") == 0.0
        assert value(s, "gpuops_slurm_scrape_failures") == 1.0
        assert not [n for (n, _) in s if n.startswith(("gpuops_queue", "slurm_"))]
    finally:
        exporter.stop()


def test_the_nodes_gpuops_powered_up_are_counted_apart(slurm: SlurmCluster) -> None:
    """Only a node whose comment is the slurm executor's scale_out mark counts (its scale_in
    powers down no other): the series scale-in-idle-cloud-nodes reads."""
    exporter = SlurmExporter(SlurmClient(conf=str(slurm.conf)), host="127.0.0.1", port=0).start()
    slurm.cmd("scontrol", "update", "nodename=gpu-a", "comment=gpuops:scale_out:d1")
    try:
        _, s = scrape(exporter.url)
        assert value(s, "gpuops_slurm_nodes", pool="gpu", state="idle") == 2.0
        scaled = {k: v for k, v in s.items() if k[0] == "gpuops_slurm_scaled_out_nodes"}
        assert scaled == {
            ("gpuops_slurm_scaled_out_nodes", frozenset({("pool", "gpu"), ("state", "idle")})): 1.0
        }
    finally:
        slurm.cmd("scontrol", "update", "nodename=gpu-a", "comment=")
        exporter.stop()
