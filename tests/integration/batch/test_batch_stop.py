"""An operation the engine runs, stopped: the kill switch between two waves pauses it with no
node started after (``resume`` goes on, redoing nothing); with ``on_stop: cancel`` the kill
switch kills the running step's process group, the node stays in the middle of its procedure
and its step runs again, whole, when the operation goes on."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from gpuops.actions.command import CommandExecutor
from gpuops.model.decisions import Decision, Outcome
from gpuops.runtime.batch import BatchStatus, NodeStatus
from gpuops.runtime.facade import Engine
from gpuops.runtime.fleets import NodesFile
from gpuops.runtime.rollouts import BatchHost
from gpuops.settings import BatchSettings
from tests.builders import build_engine
from tests.fakes.executors import Recorder
from tests.fakes.rollout_fleet import FileFleet, FileFleetExecutor
from tests.waiting import wait_for

STEP = """\
import os, subprocess, sys, time
node, folder = sys.argv[1], sys.argv[2]
with open(os.path.join(folder, "calls", node), "a") as out:
    out.write("step " + os.environ["GPUOPS_DECISION_ID"] + "\\n")
slow = os.path.join(folder, "slow")
if os.path.exists(slow):
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(folder, "pids"), "w") as pids:
        pids.write(f"{os.getpid()} {child.pid}")
    os.remove(slow)
    child.wait()
"""


class Hooked(FileFleetExecutor):
    """The file fleet's executor, calling ``after(node, verb)`` after each change."""

    def __init__(self, folder: Path) -> None:
        super().__init__({"dir": folder})
        self.after: Callable[[str, str], None] = lambda node, verb: None

    def run(self, decision: Decision) -> dict[str, str]:
        changed = super().run(decision)
        assert decision.action is not None
        self.after(decision.target.labels["node"], decision.action.type)
        return changed


def engine_on(
    tmp: Path, count: int, seen: list[tuple[Decision, Outcome | None]]
) -> tuple[Engine, FileFleet, Hooked]:
    fleet = FileFleet(tmp / "fleet")
    fleet.create([f"gpu-{i:03d}" for i in range(1, count + 1)])
    executor = Hooked(fleet.folder)
    (tmp / "step.py").write_text(STEP)
    engine = build_engine(
        tmp,
        {"none.yaml": "groups: []\n"},
        reload=False,
        executors={"rollout-fleet": executor, "command": CommandExecutor},
        listener=lambda d, o: seen.append((d, o)),
        batch=BatchSettings(nodes=fleet.folder / "nodes.yaml", folder=tmp),
    )
    engine.start()
    return engine, fleet, executor


def operation(tmp: Path, extra: str = "") -> str:
    return (
        "operation: reboot\n"
        "targets: {pool: a100, all: true}\n"
        "quarantine: rollout-fleet\n"
        f"step: {{command: [{sys.executable}, {tmp / 'step.py'}, '{{{{ $labels.node }}}}',"
        f" {tmp / 'fleet'}]}}\n"
        "canary: 1\nmax_parallel: 2\nmax_unavailable: 2\nfailure_threshold: 1\n"
        f"enforce: true\n{extra}"
    )


def status(engine: Engine, batch: str) -> str:
    return engine.batches.record(batch).status


def test_kill_switch_between_two_waves_stops_the_rollout(tmp_path: Path) -> None:
    seen: list[tuple[Decision, Outcome | None]] = []
    engine, fleet, executor = engine_on(tmp_path, 6, seen)

    def kill_after_canary(node: str, verb: str) -> None:
        if (node, verb) == ("gpu-001", "resume"):
            engine.set_control("kill_switch", True, "admin")

    executor.after = kill_after_canary
    try:
        batch = engine.rollouts.start(operation(tmp_path), "op.yaml")
        wait_for(lambda: status(engine, batch) == BatchStatus.PAUSED, 30, "the pause")
        rec = engine.batches.record(batch)
        assert rec.why == "the kill switch is on" and rec.waves == 1
        assert sorted(fleet.calls()) == ["gpu-001"]  # no node of the next wave started
        assert all(s["state"] == "up" for s in fleet.state().values())

        executor.after = lambda node, verb: None
        engine.set_control("kill_switch", False, "admin")
        engine.rollouts.resume(batch)
        wait_for(lambda: status(engine, batch) == BatchStatus.DONE, 30, "the end")
    finally:
        engine.stop()
    calls = fleet.calls()
    assert sorted(calls) == [f"gpu-{i:03d}" for i in range(1, 7)]
    for node, made in calls.items():
        assert [what for what, _ in made] == ["migrate", "step", "resume"], node
    assert max(e["out"] for e in fleet.events()) <= 2


def test_on_stop_cancel_kills_the_running_step_and_runs_it_again(tmp_path: Path) -> None:
    seen: list[tuple[Decision, Outcome | None]] = []
    engine, fleet, _ = engine_on(tmp_path, 2, seen)
    (fleet.folder / "slow").touch()  # the first step waits on a child for a minute
    pids = fleet.folder / "pids"
    try:
        batch = engine.rollouts.start(operation(tmp_path, "on_stop: cancel\n"), "op.yaml")
        wait_for(pids.exists, 30, "the step running")
        step, child = (int(p) for p in pids.read_text().split())
        engine.set_control("kill_switch", True, "admin")
        wait_for(lambda: status(engine, batch) == BatchStatus.PAUSED, 10, "the pause")
        assert engine.batches.record(batch).why == "the kill switch is on"
        for pid in (step, child):  # the whole process group, the child too
            wait_for(partial(gone, pid), 10, f"process {pid} killed")
        node = engine.batches.nodes(batch)["gpu-001"]
        assert (node.status, node.done) == (NodeStatus.RUNNING, ["quarantine"])
        assert fleet.state()["gpu-001"]["state"] == "drained"
        [cancelled] = [
            o for d, o in seen if o is not None and d.action and d.action.type == "batch_step"
        ]
        assert cancelled.status.value == "skipped"
        assert (cancelled.error or "").startswith(
            "cancelled: the kill switch is on; command "
        ) and (cancelled.error or "").endswith(": its process group was killed")

        engine.set_control("kill_switch", False, "admin")
        engine.rollouts.resume(batch)
        wait_for(lambda: status(engine, batch) == BatchStatus.DONE, 30, "the end")
    finally:
        engine.stop()
    first = fleet.calls()["gpu-001"]
    assert [what for what, _ in first] == ["migrate", "step", "step", "resume"]
    assert first[1][1] == first[2][1]  # the same decision id, run again whole
    assert all(s["state"] == "up" for s in fleet.state().values())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie: dead


def test_a_posted_operation_reads_its_paths_from_its_folder_at_each_resume(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ops"
    folder.mkdir()
    (folder / "upgrade.yml").write_text("- hosts: all\n  tasks: []\n")
    (folder / "inventory.yaml").write_text("all:\n  hosts: {gpu-001: {}, gpu-002: {}}\n")
    fleet = FileFleet(tmp_path / "fleet")
    fleet.create(["gpu-001", "gpu-002"])
    ansible = Recorder("ansible")
    engine = build_engine(
        tmp_path,
        {},
        reload=False,
        executors={"rollout-fleet": FileFleetExecutor, "ansible": ansible},
        executor_settings={"rollout-fleet": {"dir": str(fleet.folder)}},
    )
    nodes = NodesFile(fleet.folder / "nodes.yaml")
    host = BatchHost(engine.batches, fleet=nodes, folder=tmp_path, leading=lambda: False)
    text = (
        "operation: upgrade\ntargets: {pool: a100, all: true}\nquarantine: rollout-fleet\n"
        "step: {ansible: upgrade.yml, inventory: inventory.yaml}\nmax_unavailable: 1\n"
        "enforce: true\n"
    )
    try:
        batch = host.start(text, "upgrade.yaml", str(folder))  # a standby here: it waits
        rec = engine.batches.run(batch, nodes)  # the file read again from the record
        assert rec.status == BatchStatus.DONE, rec.why
        assert [d.action.params["playbook"] for d in ansible.ran if d.action] == [
            str(folder / "upgrade.yml")
        ] * 2
        second = host.start(text, "upgrade.yaml", str(folder))
        (folder / "upgrade.yml").unlink()  # gone before it runs: it pauses, saying why
        rec = engine.batches.run(second, nodes)
        assert (rec.status, rec.why) == (
            BatchStatus.PAUSED,
            "its file no longer reads: upgrade.yaml:4: step.ansible: playbook upgrade.yml not"
            f" found (looked for {folder}/upgrade.yml)",
        )
        assert engine.batches.cancel(second).status == BatchStatus.CANCELLED
    finally:
        engine.stop()
