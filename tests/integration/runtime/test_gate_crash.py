"""Write-ahead audit under crashes and a full disk: no decision in the state file without its
audit document, no action on a full disk.

An engine process deciding in a loop is SIGKILLed at random instants ``KILLS`` times, then
restarted once to reconcile; state and spool are compared by decision id, and every action an
executor ran must have its intent in the spool. The full-disk run puts the spool on a small
tmpfs (root only; skipped elsewhere — the unit tests inject ENOSPC at the spool's write
instead).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.audit.spool import read_spool
from tests.builders import build_engine
from tests.fakes.prometheus import FakeSource
from tests.waiting import wait_for

KILLS = 12

CHILD = r"""
import os, sys, time
from pathlib import Path
from gpuops.model.decisions import Sample, freeze
from tests.builders import build_engine
from tests.fakes.prometheus import FakeSource

work = Path(sys.argv[1])
once = sys.argv[2] == "once"

class Prom(FakeSource):
    step = 0
    def query(self, expr, at=None):
        Prom.step += 1
        return tuple(
            Sample(freeze({"uuid": f"GPU-{i:02d}"}), 0.1, 0)
            for i in range(20) if (Prom.step + i) % 3
        )

class Ran:
    # one file per action run, named by its decision id: creating a name is atomic, where a
    # line appended to a log can be torn by the SIGKILL (a short write across a page boundary)
    name = "log"
    verbs = None
    def __init__(self, settings):
        (work / "ran").mkdir(exist_ok=True)
    def run(self, decision):
        os.close(os.open(work / "ran" / decision.id, os.O_WRONLY | os.O_CREAT))
        return {}

engine = build_engine(work, source=Prom(), executors={"log": Ran})
engine.audit.start()
engine.gate.resume()
if once:
    engine.wait_idle(30)
    engine.stop()
    sys.exit(0)
policy = engine.rules.policy("reclaim")
iteration = 0
while True:
    engine.evaluate_policy(policy, time.time())
    iteration += 1
    print(iteration, flush=True)
"""

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - policy: reclaim
        expr: idle
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        on_clear: {type: restore, executor: log}
        mode: enforce
"""


def _child(work: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(work), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )


def _compare(work: Path) -> tuple[set[str], set[str], set[str], set[str]]:
    db = sqlite3.connect(work / "state.sqlite")
    stored = {r[0] for r in db.execute("SELECT id FROM decisions")}
    finished = {r[0] for r in db.execute("SELECT id FROM decisions WHERE outcome IS NOT NULL")}
    db.close()
    docs = [d for d in read_spool(work / "audit") if "gpuops" in d]
    audited = {d["gpuops"]["decision"]["id"] for d in docs}
    with_outcome = {d["gpuops"]["decision"]["id"] for d in docs if "outcome" in d["gpuops"]}
    assert finished <= with_outcome, f"{len(finished - with_outcome)} outcomes not audited"
    ran = set(os.listdir(work / "ran")) if (work / "ran").exists() else set()
    return stored, audited, ran, finished


def test_sigkill_at_random_instants_leaves_no_decision_unaudited(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "p.yaml").write_text(RULES)
    rng = random.Random(9)
    for _ in range(KILLS):
        child = _child(tmp_path, "loop")
        assert child.stdout is not None
        wanted = rng.randint(1, 6)
        for _ in range(wanted):  # a random number of cycles, then mid-way through the next
            assert child.stdout.readline(), "the engine process died by itself"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
    final = _child(tmp_path, "once")
    assert final.wait(60) == 0
    assert final.stdout is not None
    final.stdout.close()
    stored, audited, ran, _ = _compare(tmp_path)
    print(f"{KILLS} SIGKILLs: {len(stored)} decisions in the state file, {len(ran)} actions run")
    assert len(stored) > 50
    assert stored - audited == set(), f"{len(stored - audited)} decisions without a document"
    assert ran <= audited, f"{len(ran - audited)} actions ran without an intent in the spool"


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "audit"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the unit tests inject ENOSPC instead)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_tmpfs_spool_stops_actions_and_they_resume_with_space(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    from gpuops.actions.retry import RetryPolicy
    from gpuops.model.decisions import Decision, Sample, freeze
    from gpuops.settings import AuditConfig

    ran: list[str] = []

    class Ran:
        name = "log"
        verbs: frozenset[str] | None = None

        def run(self, decision: Decision) -> dict[str, str]:
            ran.append(decision.id)
            return {}

    targets: list[int] = []

    class Prom(FakeSource):
        def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
            return tuple(Sample(freeze({"uuid": f"GPU-{i:04d}"}), 0.1, 0) for i in targets)

    clock = [3_000_000.0]
    engine = build_engine(
        tmp_path,
        RULES,
        source=Prom(),
        clock=lambda: clock[0],
        executors={"log": Ran()},
        action_retry=RetryPolicy(attempts=1),
        audit=AuditConfig(spool_dir=small_tmpfs),
    )
    policy = engine.rules.policy("reclaim")
    assert policy is not None
    try:
        decided = 0
        for batch in range(40):  # 10 new targets a cycle until the 64 KiB fill up
            targets.extend(range(batch * 10, batch * 10 + 10))
            clock[0] += 10
            decided += len(engine.evaluate_policy(policy))
            assert engine.wait_idle(10)
            if engine.problem() is not None and decided > len(ran):  # an intent was refused
                break  # (an outcome's write may fill the disk first: the next intents fail)
        assert engine.problem() is not None, "the tmpfs never filled up"
        assert "No space left on device" in (engine.problem() or "")
        docs = list(read_spool(small_tmpfs))
        intents = {d["gpuops"]["decision"]["id"] for d in docs if "gpuops" in d}
        held = decided - len(ran)
        print(f"full tmpfs: {decided} decisions, {len(ran)} ran, {held} held for the audit")
        assert set(ran) <= intents, f"{len(set(ran) - intents)} actions ran unaudited"
        assert held > 0
        subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=True)
        wait_for(lambda: engine.gate.reconcile() >= 0 and engine.problem() is None, 10, "space")
        assert engine.wait_idle(10)
        assert len(ran) == decided
        docs = list(read_spool(small_tmpfs))
        intents = {d["gpuops"]["decision"]["id"] for d in docs if "gpuops" in d}
        assert set(ran) <= intents
        assert engine.store.unaudited() == []
    finally:
        engine.stop()
