"""``gpuops batch run`` as a process, SIGKILLed in the middle of a rollout, then ``gpuops batch
resume``: no finished step runs again (a step the kill interrupted runs again with the same
decision id, which the program gets to make itself idempotent), and ``status``, ``retry`` and
``cancel`` answer from the stored state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

STEP = """\
import os, sys, time
node, folder = sys.argv[1], sys.argv[2]
with open(os.path.join(folder, node), "a") as out:
    out.write(os.environ["GPUOPS_DECISION_ID"] + "\\n")
time.sleep(0.2)
sys.exit(3 if node == "n5" else 0)
"""


def setup(tmp: Path) -> tuple[Path, Path, Path]:
    (tmp / "rules").mkdir()
    (tmp / "steps").mkdir()
    (tmp / "step.py").write_text(STEP)
    config = tmp / "engine.yaml"
    config.write_text(
        "rules: [rules]\nmetrics_listen: null\nstate_file: state.sqlite\n"
        "audit: {spool_dir: audit}\n"
    )
    nodes = tmp / "nodes.yaml"
    nodes.write_text(
        "nodes:\n" + "".join(f"  - {{name: n{i}, pool: p, gpus: 8}}\n" for i in range(1, 9))
    )
    op = tmp / "op.yaml"
    op.write_text(
        "operation: rollout\n"
        "targets: {pool: p, all: true}\n"
        "quarantine: none\n"
        f"step: {{command: [{sys.executable}, {tmp}/step.py, '{{{{ $labels.node }}}}',"
        f" {tmp}/steps]}}\n"
        "canary: 1\nmax_parallel: 2\nmax_unavailable: 2\nfailure_threshold: 3\n"
        "enforce: true\n"
    )
    return config, nodes, op


def gpuops(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["batch", *args])
    return result.exit_code, result.stdout if result.exit_code == 0 else result.stderr


def test_killed_mid_rollout_resumes_without_redoing_a_finished_step(tmp_path: Path) -> None:
    config, nodes, op = setup(tmp_path)
    steps = tmp_path / "steps"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    run = subprocess.Popen(
        [sys.executable, "-c", "from gpuops.cli import main; main()", "batch", "run", str(op)]
        + ["--config", str(config), "--nodes", str(nodes)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: len(list(steps.iterdir())) >= 4 or run.poll() is not None,
            timeout=60,
            what="four nodes stepped",
        )
        assert run.poll() is None, "the run ended before it was killed"
        code, said = gpuops("status", "--config", str(config))  # while it runs: refused
        assert code == 1 and "is in use by another gpuops process: an engine of" in said
    finally:
        run.send_signal(signal.SIGKILL)
        out, _ = run.communicate(timeout=10)
    started = [line for line in out.splitlines() if line.startswith("batch ")]
    batch = started[0].split()[1]  # "batch <id> started"
    before = {p.name: p.read_text().split() for p in steps.iterdir()}

    code, said = gpuops("status", batch, "--config", str(config))
    assert code == 0 and said.startswith(f"batch {batch}: running;")

    code, said = gpuops("resume", batch, "--config", str(config), "--nodes", str(nodes))
    assert code == 0, said
    assert said.startswith(f"batch {batch}: done (failed: n5);")
    assert "  n5: failed: step: " in said
    after = {p.name: p.read_text().split() for p in steps.iterdir()}
    assert sorted(after) == [f"n{i}" for i in range(1, 9)]
    for node, ids in after.items():
        assert len(set(ids)) == 1, f"{node} ran as two decisions: {ids}"
        if node in before and len(before[node]) == 1 and node != "n5":
            # finished before the kill, or interrupted in its step: at most once more, same id
            assert len(ids) <= 2
    finished = [n for n, ids in before.items() if len(after[n]) == len(ids)]
    assert finished, "some node finished before the kill and ran nothing after it"

    code, said = gpuops("retry", batch, "n1", "--config", str(config))
    assert code == 1 and "n1 of batch operation" in said and "only a failed node" in said
    code, said = gpuops("retry", batch, "n5", "--config", str(config))
    assert code == 0 and said == f"n5 of batch {batch} queued again: gpuops batch resume {batch}\n"
    code, said = gpuops("cancel", batch, "--config", str(config))
    assert code == 0 and said.startswith(f"batch {batch}: cancelled (cancelled);")
