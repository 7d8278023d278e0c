"""`gpuops whatif` end to end: the demo fleet for a quarter of a virtual hour, off and on,
with the shipped gpu-efficiency policies evaluated by the real engine at the virtual clock
against a real Prometheus fed by remote write; the actions land in the cluster at the virtual
instant they were decided, every one audited before it ran."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.audit.spool import read_spool
from gpuops.cli import cli
from gpuops.sim.whatif.prometheus import PROMETHEUS_ARGS
from gpuops.sim.whatif.runs import start_time
from gpuops.sources.promproc import PrometheusServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
HOURS = 0.25


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("whatif-prom")
    config = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
    with PrometheusServer(workdir, config, extra_args=list(PROMETHEUS_ARGS)) as prom:
        yield prom.url


def test_whatif_runs_the_engine_at_the_virtual_clock(prom_url: str, tmp_path: Path) -> None:
    plots, workdir = tmp_path / "plots", tmp_path / "work"
    result = CliRunner().invoke(
        cli,
        [
            "--log-level=warning",
            "whatif",
            "--fleet",
            str(REPO / "examples" / "fleets" / "demo.yaml"),
            "--rules",
            str(REPO / "rules" / "gpu-efficiency.yaml"),
            f"--hours={HOURS}",
            f"--prometheus-url={prom_url}",
            f"--workdir={workdir}",
            f"--plots={plots}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    off, on = doc["off"]["report"], doc["on"]["report"]
    # the same workload: the demo's scripted jobs, none finished within the run
    assert off["hours"] == on["hours"] == pytest.approx(HOURS)
    assert off["reclaims"] == 0 and off["downclock_loss"] == 0.0
    # the idle notebook: < 0.20 over the (first 30 min of) history, `for: 10m` -> reclaimed at
    # virtual minute 10
    assert on["reclaims"] == 1
    assert doc["on"]["outcomes"]["reclaim-idle-gpus reclaim success"] == 1
    # the light job (~0.25): 10 min window (5 min of history), `for: 5m` -> clocks capped at
    # virtual minute 5, throughput paid
    assert doc["on"]["outcomes"]["downclock-underused-gpus downclock success"] == 1
    assert 0.0 < on["downclock_loss"] < 0.03
    assert on["utilization_allocated"] > off["utilization_allocated"]
    assert [t["name"] for t in doc["targets"]][0] == "utilization over powered GPUs"
    # what the fleet saw each decision do, named by its policy (the demo's jobs have no class)
    assert doc["on"]["attribution"] == {
        "stops": [
            {"policy": "reclaim-idle-gpus", "priority_class": "", "kind": "culled", "jobs": 1}
        ],
        "acted": {"": ["downclock-underused-gpus", "reclaim-idle-gpus"]},
        "slowed": {"": ["downclock-underused-gpus"]},
    }
    assert doc["off"]["attribution"] == {"stops": [], "acted": {}, "slowed": {}}

    start = start_time(HOURS, 0.0)
    docs = list(read_spool(workdir / "engine" / "audit"))
    reclaim = [d for d in docs if d.get("rule", {}).get("name") == "reclaim-idle-gpus"]
    assert len(reclaim) == 2, reclaim  # the intent, then the outcome
    intent, outcome = reclaim[0], reclaim[-1]
    assert intent["event"].get("outcome") in (None, "unknown")  # written before it ran
    assert outcome["event"]["outcome"] == "success"
    at = datetime.fromisoformat(intent["@timestamp"]).timestamp() - start
    assert at == 600.0, f"reclaim decided at virtual second {at:.0f}"

    for name in ("utilization.png", "queue.png", "power.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_whatif_over_seeds_reports_spreads(tmp_path: Path) -> None:
    args = ["--log-level=warning", "whatif", "--fleet", str(REPO / "examples/fleets/demo.yaml")]
    args += ["--rules", str(REPO / "rules" / "gpu-efficiency.yaml"), "--hours=0.2"]
    result = CliRunner().invoke(cli, [*args, "--seeds=7,9", f"--plots={tmp_path}", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["seeds"] == [7, 9]
    assert [r["seed"] for r in doc["runs"]] == [7, 9]
    reclaims = next(f for f in doc["figures"] if f["name"] == "reclaims")
    assert reclaims["on"]["seeds"] == 2
    assert reclaims["on"]["min"] <= reclaims["on"]["median"] <= reclaims["on"]["max"]
    assert (tmp_path / "seed-9" / "queue.png").is_file()
    shared = CliRunner().invoke(cli, [*args, "--seeds=2", "--prometheus-url=http://x:9090"])
    assert shared.exit_code == 2
    assert "several seeds need a fresh Prometheus each" in shared.output


ROLLOUT = """\
operation: reboot-all
targets: {pool: default, all: true}
step: {command: ["true"]}
reboot: {command: ["true"]}
validate: {command: ["true"]}
canary: 1
max_parallel: 2
max_unavailable: 2
timing: {quarantine: 30s, step: 2m, reboot: 1m, validate: 30s, return: 10s}
"""


def test_whatif_rolls_a_batch_operation_over_the_on_run_and_says_what_it_cost(
    tmp_path: Path,
) -> None:
    operation = tmp_path / "reboot.yaml"
    operation.write_text(ROLLOUT, encoding="utf-8")
    args = ["--log-level=warning", "whatif", "--fleet", str(REPO / "examples/fleets/demo.yaml")]
    args += ["--rules", str(REPO / "rules" / "gpu-efficiency.yaml"), f"--hours={HOURS}"]
    args += [f"--batch={operation}"]  # a Prometheus of its own: the other test wrote this time
    late = CliRunner().invoke(cli, [*args, "--batch-at=0.25"])
    assert late.exit_code == 2 and "not within the run's 0.25 virtual hours" in late.output
    result = CliRunner().invoke(cli, [*args, "--batch-at=0"])
    assert result.exit_code == 0, result.output
    # four nodes of 250 s each, at most two out at once: the canary, two, then the last
    assert "rollout reboot-all from +0s: 4 nodes, 4 done in 3 waves, ended at +12m45s" in (
        result.output
    )
    hours_out = re.search(r"GPU-hours out of service: ([0-9.]+)", result.output)
    assert hours_out and float(hours_out.group(1)) == pytest.approx(4 * 4 * 255 / 3600, abs=0.05)
    drained = re.search(
        r"jobs its drains requeued: (\d+) .*; moved to other nodes: (\d+)", result.output
    )
    assert drained and int(drained.group(1)) + int(drained.group(2)) > 0
    assert "most nodes out of service at once: 2 (budget 2)" in result.output
