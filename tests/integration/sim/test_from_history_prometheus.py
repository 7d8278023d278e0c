"""`gpuops fleet from-history --prometheus`: each job class's utilization profile from a real
Prometheus holding the NVML exporter's series and the allocation series over the history's
window (written as the exporters' scrapes would have them, with their timestamps), and a clear
error for a Prometheus that cannot be reached, that holds nothing of the window or nothing of
the history's projects."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sim.fleet.remotewrite import RemoteWriter
from gpuops.sources.promproc import PrometheusServer, free_port

pytestmark = pytest.mark.integration

BASE = (int(time.time()) // 60) * 60 - 2 * 3600
"""The jobs' submit time: two hours ago, within what the remote-write receiver appends."""
START, END = BASE + 60, BASE + 1260
JOBS = (  # id, account, node, GPU index, utilization at t (None: no series kept), GiB used
    ("101", "train", "n0", 0, lambda t: 0.86 if (t // 30) % 2 else 0.90, 30),
    ("102", "train", "n0", 1, lambda t: 0.88, 34),
    ("201", "serve", "n0", 2, lambda t: 0.05 + 0.8 * (0.5 + 0.5 * math.sin(t / 100)) ** 2, 6),
    ("202", "serve", "n0", 3, lambda t: 0.05 + 0.8 * (0.5 + 0.5 * math.cos(t / 100)) ** 2, 6),
    ("301", "dev", "n1", 0, lambda t: 0.02, 2),
    ("401", "ghost", "n1", 1, None, 0),
)
GIB = 1024**3


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("history-prom")
    config = "global:\n  scrape_interval: 30s\nscrape_configs: []\n"
    args = ["--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=30d"]
    held = {(node, gpu): (job, account, util, gib) for job, account, node, gpu, util, gib in JOBS}
    with PrometheusServer(workdir, config, extra_args=args) as prom:
        writer = RemoteWriter(prom.url)
        for t in range(BASE - 300, END + 600, 30):
            scrape: dict[tuple[tuple[str, str], ...], float] = {}
            for node, gpu in ((n, g) for n in ("n0", "n1") for g in range(4)):
                job, account, util, gib = held.get((node, gpu), ("", "", None, 0))
                running = START <= t < END and util is not None
                at = {
                    "job": "gpu-nodes",
                    "node": node,
                    "uuid": f"GPU-{node}-{gpu}",
                    "gpu": str(gpu),
                }
                busy = util(t) if running and util is not None else 0.0
                scrape[_labels(__name__="nvml_gpu_utilization_ratio", **at)] = busy
                # the memory a job holds grows to its peak in its first 15 minutes
                used = gib * GIB * min(1.0, (t - START) / 900) if running else 0.0
                scrape[_labels(__name__="nvml_gpu_memory_used_bytes", **at)] = used
                if running:  # the allocation series of the Slurm recording rule
                    labels = {**at, "job": job, "user": "u", "account": account}
                    scrape[
                        _labels(
                            __name__="gpuops_gpu_allocated",
                            **labels,
                            project=account,
                            partition="gpu",
                        )
                    ] = 1.0
            writer.add(t * 1000, scrape)
        writer.flush()
        yield prom.url


def _history(tmp_path: Path, shift_s: int = 0, accounts: dict[str, str] | None = None) -> Path:
    def at(t: int) -> str:
        return datetime.fromtimestamp(t + shift_s, UTC).strftime("%Y-%m-%dT%H:%M:%S")

    lines = ["JobID|User|Account|Partition|AllocTRES|NNodes|State|Submit|Start|End"]
    for job, account, *_ in JOBS:
        account = (accounts or {}).get(account, account)
        tres = "billing=1,cpu=1,gres/gpu=1,node=1"
        lines.append(f"{job}|u|{account}|gpu|{tres}|1|COMPLETED|{at(BASE)}|{at(START)}|{at(END)}")
    path = tmp_path / "history.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _from_history(history: Path, url: str, out: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli,
        [
            "--log-level",
            "warning",
            "fleet",
            "from-history",
            str(history),
            "--pool",
            "gpu=A100:2x4",
            "--prometheus",
            url,
            "--out",
            str(out),
        ],
    )
    return result.exit_code, result.output


def test_each_class_takes_the_profile_its_gpus_ran(prom_url: str, tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    code, output = _from_history(_history(tmp_path), prom_url, out)
    assert code == 0, output
    row = re.compile(r"^  (\S+-gpu)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)%\s+[\d.]+ GiB\s+(\w+)$", re.M)
    rows = {
        m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)), m.group(5))
        for m in row.finditer(output)
    }
    hours, mean, swing, profile = rows["train-gpu"]
    assert profile == "training" and mean == pytest.approx(88.0, abs=0.5) and swing < 3.0
    assert hours == pytest.approx(2 * 1200 / 3600, rel=0.05)  # two GPUs for 20 minutes
    assert rows["serve-gpu"][3] == "inference" and rows["serve-gpu"][2] > 15.0
    assert rows["dev-gpu"][3] == "notebook" and rows["dev-gpu"][1] == pytest.approx(2.0, abs=0.2)
    assert re.search(r"^  ghost-gpu\s+-\s+-\s+-\s+-\s+training \(no series\)$", output, re.M)
    assert re.search(r"^  train-gpu\s.*\s32 GiB\s+training$", output, re.M)
    doc = yaml.safe_load(out.read_text())
    profiles = {jc["name"]: jc["profile"] for jc in doc["job_classes"]}
    assert profiles == {
        "dev-gpu": "notebook",
        "ghost-gpu": "training",
        "serve-gpu": "inference",
        "train-gpu": "training",
    }
    memory = {jc["name"]: jc.get("memory_gib") for jc in doc["job_classes"]}
    assert memory == {"dev-gpu": 2.0, "ghost-gpu": None, "serve-gpu": 6.0, "train-gpu": 32.0}
    assert "train-gpu 88% mean" in doc["calibration"]
    load_fleet(out)  # the file validates


def test_a_prometheus_that_cannot_tell_is_named(prom_url: str, tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    history = _history(tmp_path)
    port = free_port()
    code, output = _from_history(history, f"http://127.0.0.1:{port}", out)
    assert code == 1
    assert (
        f"--prometheus http://127.0.0.1:{port}: Prometheus at http://127.0.0.1:{port} "
        "unreachable: connection refused" in output
    )
    code, output = _from_history(history, "127.0.0.1:9090", out)
    assert code == 1 and "--prometheus '127.0.0.1:9090': not a URL" in output
    code, output = _from_history(_history(tmp_path, shift_s=-86_400), prom_url, out)
    assert code == 1
    assert f"--prometheus {prom_url}: no GPU held by a job from " in output
    assert "(the history's window)" in output
    code, output = _from_history(
        _history(tmp_path, accounts={"train": "a", "serve": "b", "dev": "c", "ghost": "d"}),
        prom_url,
        out,
    )
    assert code == 1
    assert "of projects/partitions dev/gpu, serve/gpu, train/gpu, none of the history's" in output
    assert not out.exists()  # nothing written on an error
