"""Ended Slurm job runs become ECS events; a job that hits GPU out-of-memory three times (it is
requeued by RequeueExit after each) shows in `gpuops audit anomalies`, with its user and node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.audit import AuditLog, AuditSettings
from gpuops.audit.jobs import SlurmJobWatcher, expand_output_path
from gpuops.audit.spool import read_spool
from gpuops.cli import cli
from gpuops.integrations.slurm.client import SlurmClient
from gpuops.sim.slurmcluster import SlurmCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

OOM_JOB = """#!/bin/sh
echo "epoch 1 of run ${SLURM_RESTART_COUNT:-0}"
sleep 1
if [ "${SLURM_RESTART_COUNT:-0}" -lt 3 ]; then
  echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB" >&2
  exit 42
fi
echo done
"""


def test_a_job_out_of_gpu_memory_three_times_is_an_anomaly(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    script = slurm.root / "train.sh"
    script.write_text(OOM_JOB)
    script.chmod(0o755)
    out = str(slurm.root / "train-%j.out")
    oom = slurm.submit("--gres=gpu:1", "-J", "train", "--open-mode=append", "-o", out, str(script))
    plain = slurm.submit("-o", "/dev/null", "--wrap", "exit 3")
    spool = tmp_path / "jobs-audit"
    with AuditLog(AuditSettings(spool_dir=spool), host_name="watcher") as audit:
        watcher = SlurmJobWatcher(SlurmClient(conf=str(slurm.conf)), audit.record, "watcher")
        ids: list[str] = []

        def both_ended() -> bool:
            ids.extend(watcher.poll())
            states = json.loads(slurm.cmd("squeue", "--json"))["jobs"]
            return all(j["job_state"] in ("COMPLETED", "FAILED") for j in states)

        wait_for(both_ended, 60, "the jobs to end", interval=0.3)
        ids.extend(watcher.poll())
        assert watcher.poll() == []  # each run is written once
    docs = list(read_spool(spool))
    runs = [d for d in docs if d["labels"]["job"] == oom]
    assert [(d["gpuops"]["job"]["run"], d["gpuops"]["job"]["state"]) for d in runs] == [
        (0, "REQUEUED"),
        (1, "REQUEUED"),
        (2, "REQUEUED"),
        (3, "COMPLETED"),
    ]
    assert [d["event"]["outcome"] for d in runs] == ["failure"] * 3 + ["success"]
    assert runs[0]["error"]["message"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert runs[0]["labels"]["reason"] == "oom" and runs[0]["process"]["exit_code"] == 42
    node = runs[0]["labels"]["node"]
    assert node in ("gpu-a", "gpu-b") and runs[0]["host"]["name"] == node
    (failed,) = [d for d in docs if d["labels"]["job"] == plain]
    assert failed["event"]["outcome"] == "failure" and "reason" not in failed["labels"]
    assert failed["gpuops"]["job"]["state"] == "FAILED" and failed["process"]["exit_code"] == 3
    result = CliRunner().invoke(cli, ["audit", "anomalies", "--json", "--spool-dir", str(spool)])
    assert result.exit_code == 0, result.output
    findings = [json.loads(line) for line in result.stdout.splitlines()]
    oom_findings = [(f["check"], f["keys"], f["count"]) for f in findings if "oom" in f["check"]]
    assert oom_findings == [
        ("oom_job", {"job": oom}, 3),
        ("oom_user", {"user": "root"}, 3),
        ("oom_node", {"node": node}, 3),
    ]


def test_output_paths_are_expanded_as_slurm_does() -> None:
    job = {"job_id": 7, "name": "train", "user_name": "ana", "current_working_directory": "/w"}
    assert expand_output_path("", job, "gpu-a") == "/w/slurm-7.out"
    assert expand_output_path("logs/%x-%j-%u-%N.%%", job, "gpu-a") == "/w/logs/train-7-ana-gpu-a.%"
    assert expand_output_path("/o/%5j.err", job, "n") == "/o/00007.err"


def test_the_filebeat_input_looks_for_the_same_oom_lines() -> None:
    import yaml

    from gpuops.audit.jobs import OOM_PATTERNS

    path = Path(__file__).resolve().parents[3] / "elk" / "filebeat" / "slurm-job-output.yml"
    (inp,) = yaml.safe_load(path.read_text())
    assert inp["type"] == "filestream" and tuple(inp["include_lines"]) == OOM_PATTERNS
    assert inp["index"] == "logs-gpuops.decision-default"
    assert inp["fields"]["labels"]["reason"] == "oom"
