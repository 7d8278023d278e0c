"""The batch runner over a simulated fleet of 50 nodes: canary, max_unavailable counted from the
fleet's own record, skip-and-report, the failure threshold, resume, the kill switch between
waves, dry-run, a restart that redoes no finished step, retry and cancel."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.model.batch.operation import Availability, FleetNode
from gpuops.model.batch.opfile import parse_operation
from gpuops.model.decisions import Decision, Outcome
from gpuops.model.guardrails import Standing
from gpuops.runtime.batch import BatchError, BatchStatus, NodeStatus
from gpuops.runtime.facade import Engine
from gpuops.runtime.rollouts import BatchHost
from tests.builders import build_engine
from tests.waiting import wait_for


class Fleet:
    """A fleet that keeps its own record: each node's state, who drained it, and the most
    nodes out of service at any instant; its executor drains, returns, steps and validates."""

    name = "testfleet"
    verbs: frozenset[str] | None = None

    def __init__(self, count: int, drained: Sequence[str] = (), down: Sequence[str] = ()) -> None:
        self.names = [f"gpu-{i:03d}" for i in range(1, count + 1)]
        self.state = {n: "up" for n in self.names}
        self.state.update({n: "drained" for n in drained})
        self.state.update({n: "down" for n in down})
        self.ours: set[str] = set()
        self.lock = threading.Lock()
        self.most_out = self.out()
        self.calls: list[tuple[str, str, str]] = []  # (node, verb, decision id)
        self.fail_step: set[str] = set()
        self.fail_validate: set[str] = set()
        self.hang_validate: set[str] = set()
        self.after: Callable[[str, str], None] = lambda node, verb: None
        self.vetoed: set[str] = set()

    def standing(self, decision: Decision) -> Standing:
        node = decision.target.labels["node"]
        return Standing(veto="gpuops.io/do-not-touch=true" if node in self.vetoed else None)

    def out(self) -> int:
        return sum(1 for s in self.state.values() if s != "up")

    def nodes(self) -> list[FleetNode]:
        with self.lock:
            return [
                FleetNode(n, pool="a100", gpus=8, availability=Availability(self.state[n]))
                for n in self.names
            ]

    def run(self, decision: Decision) -> dict[str, str]:
        assert decision.action is not None
        node, verb = decision.target.labels["node"], decision.action.type
        with self.lock:
            self.calls.append((node, verb, decision.id))
            if verb == "migrate" and self.state[node] == "up":
                self.state[node] = "drained"
                self.ours.add(node)
                self.most_out = max(self.most_out, self.out())
            elif verb == "resume" and node in self.ours:
                self.state[node] = "up"
                self.ours.discard(node)
        if verb == "batch_step" and node in self.fail_step:
            raise PermanentError("dpkg: error processing package nvidia-driver-550")
        if verb == "validate" and node in self.fail_validate:
            raise PermanentError("nvidia-smi: driver 535.104 after the upgrade")
        if verb == "validate" and node in self.hang_validate:
            raise TemporaryError("check exited -9 after 600 s (its process group killed)")
        self.after(node, verb)
        return {"node": node}

    def done(self, verb: str) -> list[str]:
        return [n for n, v, _ in self.calls if v == verb]


OPERATION = """\
operation: driver-550
targets: {pool: a100, all: true}
quarantine: testfleet
step: {command: [upgrade]}
validate: {command: [check]}
canary: 2
max_parallel: 5
max_unavailable: 10%
failure_threshold: 2
enforce: true
"""


def engine_on(tmp: Path, fleet: Fleet, seen: list[tuple[Decision, Outcome | None]]) -> Engine:
    return build_engine(
        tmp,
        {},
        reload=False,
        executors={"testfleet": fleet, "command": fleet},
        listener=lambda d, o: seen.append((d, o)),
    )


def start(engine: Engine, fleet: Fleet, text: str = OPERATION) -> str:
    operation = parse_operation(text, "op.yaml")
    return engine.batches.start(operation, text, fleet, None)


def test_fifty_nodes_canary_budget_failures_threshold_and_resume(tmp_path: Path) -> None:
    fleet = Fleet(50, drained=["gpu-017"], down=["gpu-033"])
    fleet.fail_step = {"gpu-010"}
    fleet.fail_validate = {"gpu-030"}
    seen: list[tuple[Decision, Outcome | None]] = []
    engine = engine_on(tmp_path, fleet, seen)
    try:
        batch = start(engine, fleet)
        rec = engine.batches.run(batch, fleet)
        assert rec.status == BatchStatus.PAUSED
        assert rec.why == "failure threshold 2 reached: gpu-010, gpu-030 failed"
        nodes = engine.batches.nodes(batch)
        assert nodes["gpu-010"].status == NodeStatus.FAILED
        assert nodes["gpu-010"].error == ("step: dpkg: error processing package nvidia-driver-550")
        assert nodes["gpu-033"].status == NodeStatus.SKIPPED and nodes["gpu-033"].error == "down"
        assert fleet.state["gpu-010"] == "drained"  # failed: left out of service, reported
        assert "gpu-031" not in fleet.done("migrate")  # paused: no node started after

        rec = engine.batches.resume(batch)
        rec = engine.batches.run(batch, fleet)
        assert rec.status == BatchStatus.DONE and rec.why == "failed: gpu-010, gpu-030"
        final = engine.batches.nodes(batch)
    finally:
        engine.stop()
    assert fleet.most_out <= 5  # the fleet's own record: 10 % of 50, never more
    assert max(u for _, _, u in rec.timeline) <= 5
    assert rec.timeline[0][2] == 4  # the canary: 2 out before, 2 more
    waves: dict[int, list[str]] = {}
    for name, node in final.items():
        waves.setdefault(node.wave, []).append(name)
    assert sorted(waves[0]) == ["gpu-001", "gpu-002"]  # the canary
    migrated = fleet.done("migrate")
    assert len(migrated) == len(set(migrated)) == 49  # each once; not the down gpu-033
    assert sorted(fleet.done("resume")) == sorted(set(migrated) - {"gpu-010", "gpu-030", "gpu-017"})
    assert fleet.state["gpu-017"] == "drained"  # drained before: stays so
    ups = [n for n in fleet.names if fleet.state[n] == "up"]
    assert len(ups) == 50 - 4  # 017 (before), 033 (down), 010 and 030 (failed)
    # every step audited with the operation's id, one outcome per executor call
    outcomes = [d for d, o in seen if o is not None and d.policy == f"batch/{batch}"]
    assert sorted(d.id for d in outcomes) == sorted(c[2] for c in fleet.calls)


def test_kill_switch_between_waves_stops_and_restart_redoes_nothing(tmp_path: Path) -> None:
    fleet = Fleet(10)
    text = OPERATION.replace("max_unavailable: 10%", "max_unavailable: 2")
    seen: list[tuple[Decision, Outcome | None]] = []
    engine = engine_on(tmp_path, fleet, seen)
    batch = start(engine, fleet, text)

    def kill_after_canary(node: str, verb: str) -> None:
        if node == "gpu-002" and verb == "resume":
            engine.set_control("kill_switch", True, "admin")

    fleet.after = kill_after_canary
    rec = engine.batches.run(batch, fleet)
    assert rec.status == BatchStatus.PAUSED and rec.why == "the kill switch is on"
    assert set(fleet.done("migrate")) == {"gpu-001", "gpu-002"}
    engine.stop()

    fleet.after = lambda node, verb: None
    restarted = engine_on(tmp_path, fleet, seen)  # a new engine on the same state file
    try:
        restarted.set_control("kill_switch", False, "admin")
        restarted.batches.resume(batch)
        rec = restarted.batches.run(batch, fleet)
    finally:
        restarted.stop()
    assert rec.status == BatchStatus.DONE and rec.why == ""
    steps = [(n, v) for n, v, _ in fleet.calls]
    assert len(steps) == len(set(steps)) == 10 * 4  # no step of any node twice
    assert fleet.most_out <= 2


def test_dry_run_runs_nothing_and_audits_each_step(tmp_path: Path) -> None:
    fleet = Fleet(6)
    text = OPERATION.replace("enforce: true\n", "").replace("10%", "2")
    seen: list[tuple[Decision, Outcome | None]] = []
    engine = engine_on(tmp_path, fleet, seen)
    try:
        batch = start(engine, fleet, text)
        rec = engine.batches.run(batch, fleet)
    finally:
        engine.stop()
    assert rec.status == BatchStatus.DONE
    assert fleet.calls == []
    planned = [d for d, o in seen if o is not None and d.policy == f"batch/{batch}"]
    assert len(planned) == 6 * 4
    assert {d.verdict.value for d in planned} == {"dry_run"}


def test_retry_of_a_failed_node_and_a_second_operation_refused(tmp_path: Path) -> None:
    fleet = Fleet(6)
    fleet.fail_step = {"gpu-003"}
    text = OPERATION.replace("10%", "2").replace("failure_threshold: 2", "failure_threshold: 5")
    engine = engine_on(tmp_path, fleet, [])
    try:
        batch = start(engine, fleet, text)
        assert engine.batches.run(batch, fleet).why == "failed: gpu-003"
        from gpuops.model.batch.plan import PlanError

        with pytest.raises(PlanError, match=r"targets: gpu-003 \(in driver-550-"):
            start(engine, fleet, text)  # gpu-003 is still in the first one
        fleet.fail_step = set()
        engine.batches.retry(batch, "gpu-003")
        engine.batches.resume(batch)
        rec = engine.batches.run(batch, fleet)
        assert rec.status == BatchStatus.DONE and rec.why == ""
        assert fleet.state["gpu-003"] == "up"
        with pytest.raises(BatchError, match="gpu-001 of batch operation .* is done"):
            engine.batches.retry(batch, "gpu-001")
    finally:
        engine.stop()


def test_cancel_returns_the_nodes_it_holds(tmp_path: Path) -> None:
    fleet = Fleet(6)
    text = OPERATION.replace("10%", "2")
    engine = engine_on(tmp_path, fleet, [])
    batch = start(engine, fleet, text)

    def stop_mid_step(node: str, verb: str) -> None:
        if node == "gpu-001" and verb == "batch_step":
            engine.set_control("paused", True, "admin")

    fleet.after = stop_mid_step
    try:
        assert engine.batches.run(batch, fleet).status == BatchStatus.PAUSED
        assert fleet.state["gpu-001"] == "drained"
        engine.set_control("paused", False, "admin")
        rec = engine.batches.cancel(batch)
        nodes = engine.batches.nodes(batch)
    finally:
        engine.stop()
    assert rec.status == BatchStatus.CANCELLED
    assert all(s == "up" for s in fleet.state.values())
    assert {n.status for n in nodes.values()} == {NodeStatus.CANCELLED}


def test_a_vetoed_node_is_never_touched_and_pauses_the_operation(tmp_path: Path) -> None:
    fleet = Fleet(4)
    fleet.vetoed = {"gpu-002"}
    seen: list[tuple[Decision, Outcome | None]] = []
    engine = engine_on(tmp_path, fleet, seen)
    try:
        batch = start(engine, fleet, OPERATION.replace("10%", "2"))
        rec = engine.batches.run(batch, fleet)
    finally:
        engine.stop()
    assert rec.status == BatchStatus.PAUSED
    assert rec.why == "gpu-002: veto: gpuops.io/do-not-touch=true"
    assert "gpu-002" not in {n for n, _, _ in fleet.calls}
    held = [d for d, o in seen if d.target.labels.get("node") == "gpu-002" and o is not None]
    assert [d.verdict.value for d in held] == ["suppressed:veto"]


class DrainsOnly:
    """An executor that drains a node and cannot return it."""

    name = "drains-only"
    verbs: frozenset[str] | None = frozenset({"migrate"})

    def __init__(self, settings: object = None) -> None:
        self.settings = settings

    def run(self, decision: Decision) -> dict[str, str]:
        raise AssertionError("Must not be called!")


def test_a_quarantine_executor_that_cannot_return_a_node_is_refused(tmp_path: Path) -> None:
    from gpuops.model.batch.plan import PlanError

    fleet = Fleet(4)
    engine = build_engine(
        tmp_path, {}, reload=False, executors={"drains-only": DrainsOnly, "command": fleet}
    )
    try:
        with pytest.raises(
            PlanError, match="quarantine: executor 'drains-only' does not drain and return"
        ):
            start(engine, fleet, OPERATION.replace("testfleet", "drains-only").replace("10%", "2"))
        with pytest.raises(PlanError, match=r"quarantine: unknown executor 'slurm' \(known: "):
            start(engine, fleet, OPERATION.replace("testfleet", "slurm").replace("10%", "2"))
    finally:
        engine.stop()


def test_the_leader_drives_it_and_a_stop_leaves_it_running_between_two_steps(
    tmp_path: Path,
) -> None:
    fleet = Fleet(4)
    engine = engine_on(tmp_path, fleet, [])
    leading = [False]
    host = BatchHost(engine.batches, fleet=fleet, folder=tmp_path, leading=lambda: leading[0])
    reached, release = threading.Event(), threading.Event()

    def hold_the_first_step(node: str, verb: str) -> None:
        if (node, verb) == ("gpu-001", "batch_step"):
            reached.set()
            release.wait(10)

    fleet.after = hold_the_first_step
    try:
        batch = start(engine, fleet, OPERATION.replace("10%", "2"))
        host.kick()  # a standby drives nothing
        assert host.driven() == [] and fleet.calls == []

        leading[0] = True
        host.kick()
        assert reached.wait(10) and host.driven() == [batch]
        stopping = threading.Thread(target=host.stop)
        stopping.start()
        host.kick()  # a stopping engine starts nothing more
        release.set()
        stopping.join(10)
        assert not stopping.is_alive() and host.driven() == []
        rec = engine.batches.record(batch)
        node = engine.batches.nodes(batch)["gpu-001"]
        assert rec.status == BatchStatus.RUNNING  # for the next start, not paused
        assert (node.status, node.done) == (NodeStatus.RUNNING, ["quarantine", "step"])

        fleet.after = lambda node, verb: None
        again = BatchHost(engine.batches, fleet=fleet, folder=tmp_path, leading=lambda: True)
        again.kick()  # the next start goes on: the validation of gpu-001 next
        wait_for(lambda: engine.batches.record(batch).status == BatchStatus.DONE, 30, "done")
        again.stop()
    finally:
        release.set()
        engine.stop()
    steps = [(n, v) for n, v, _ in fleet.calls]
    assert len(steps) == len(set(steps)) == 4 * 4  # no step twice


def test_a_validation_that_times_out_has_failed_and_is_not_tried_again(tmp_path: Path) -> None:
    """The command executor's timeout is a temporary failure, which the gate tries again for
    an action; a node's health check that timed out has failed, at its first try."""
    fleet = Fleet(20)
    fleet.hang_validate = {"gpu-001"}
    engine = engine_on(tmp_path, fleet, [])
    try:
        text = OPERATION.replace("{pool: a100, all: true}", "{nodes: [gpu-001, gpu-002]}")
        rec = engine.batches.run(start(engine, fleet, text), fleet)
        nodes = engine.batches.nodes(rec.id)
        assert nodes["gpu-001"].status == NodeStatus.FAILED
        assert nodes["gpu-001"].error.startswith("validate: check exited -9")
        assert nodes["gpu-002"].status == NodeStatus.DONE
        assert sorted(fleet.done("validate")) == ["gpu-001", "gpu-002"]  # one try each
    finally:
        engine.stop()
