"""The batch runner: rolls a batch operation (``gpuops.model.batch``) over its nodes, wave after
wave, every node step through the one gate (``Gate.run_step``), its state in the store after
each step.

Before each wave it plans again over the fleet as it is then (``gpuops.model.batch.plan
.remaining``): every node out of service, for any reason, and every node the operation holds
counts against ``max_unavailable``. A node goes quarantine → step → reboot → validate → return;
a failed step or validation leaves it quarantined and reported (``failed``) and the others go
on, until ``failure_threshold`` failed nodes pause the operation. The kill switch and pause
stop it between steps (``paused``). ``resume`` goes on where it stopped — a node in the middle
of its procedure from its next step, never a finished node again —, ``cancel`` stops it
(nodes it holds are returned), ``retry`` puts a failed node back in the queue. A node out of
service before the operation is never returned to service by it.

Built by ``gpuops.runtime.facade.Engine``; driven by ``gpuops batch`` (``gpuops.cli.batch``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from gpuops.model.batch.operation import FleetNode, OnStop, Operation, Phase, Step, StepKind
from gpuops.model.batch.opfile import parse_operation
from gpuops.model.batch.plan import PlanError, matches, plan, remaining
from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    OutcomeStatus,
    Target,
    Transition,
    decision_id,
)
from gpuops.model.rules.model import RulesError
from gpuops.runtime.fleets import FleetError
from gpuops.runtime.gate import DRY_RUN_PREFIX, NOT_LEADING, Gate
from gpuops.store.interface import BatchRepository, StoredBatch

log = logging.getLogger(__name__)


class BatchStatus(StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"
    """``approval: true``: nothing runs until a user with approvals:decide approves it."""
    RUNNING = "running"
    PAUSED = "paused"
    """Stopped by the kill switch, pause, the failure threshold or no room: ``resume``."""
    DONE = "done"
    CANCELLED = "cancelled"


class NodeStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class BatchError(ValueError):
    """A batch request that cannot be done (an unknown operation or node, a bad state)."""


class Executors(Protocol):
    """What the runner asks of the executor registry (``gpuops.actions.registry``)."""

    def names(self) -> list[str]: ...
    def verbs(self, name: str) -> frozenset[str] | None: ...


class FleetView(Protocol):
    """The fleet as it is now (Slurm, Kubernetes, a nodes file)."""

    def nodes(self) -> Sequence[FleetNode]: ...


@dataclass
class NodeRecord:
    """Where one node is in the procedure (stored as JSON after each step)."""

    status: str = NodeStatus.PENDING.value
    done: list[str] = field(default_factory=list)
    """The phases it finished, in order."""
    was_out: bool = False
    """Out of service before the operation: never returned by it."""
    wave: int = -1
    attempt: int = 0
    error: str = ""


@dataclass
class BatchRecord:
    """An operation as stored: its file's text (read again at each resume), its progress."""

    id: str
    file: str
    text: str
    created_at: float
    status: str = BatchStatus.RUNNING.value
    why: str = ""
    waves: int = 0
    forgiven: int = 0
    """Failed nodes an admin's ``resume`` let the operation go on past."""
    order: list[str] = field(default_factory=list)
    timeline: list[list[Any]] = field(default_factory=list)
    """``[at, wave, unavailable]`` as each wave starts."""
    started_by: str = ""
    """Who started it (empty: not known)."""
    folder: str = ""
    """Where its paths are relative to (empty: its file's folder)."""

    def operation(self, checked: bool = True) -> Operation:
        """Its file read again: ``RulesError`` when a path it names is gone (unless not
        ``checked``: its paths as they were)."""
        folder = Path(self.folder) if self.folder else Path(self.file).parent
        return parse_operation(self.text, self.file, folder if checked else None)


def _action(operation: Operation, phase: Phase) -> ActionSpec:
    if phase is Phase.QUARANTINE:
        return ActionSpec("migrate", operation.quarantine)
    if phase is Phase.RETURN:
        return ActionSpec("resume", operation.quarantine)
    if phase is Phase.VALIDATE:
        assert operation.validate is not None
        params = {
            "argv": list(operation.validate.command),
            "timeout_s": operation.validate.timeout_s,
        }
        return ActionSpec("validate", "command", params)
    step = operation.step if phase is Phase.STEP else operation.reboot
    assert step is not None
    return _step_action(step, phase)


def _step_action(step: Step, phase: Phase) -> ActionSpec:
    if step.kind is StepKind.ANSIBLE:
        params = {
            "playbook": step.playbook,
            "inventory": step.inventory,
            "extra_vars": dict(step.extra_vars),
            "timeout_s": step.timeout_s,
        }
        return ActionSpec("run_playbook", "ansible", params)
    return ActionSpec(
        f"batch_{phase.value}", "command", {"argv": list(step.command), "timeout_s": step.timeout_s}
    )


class BatchRunner:
    """Starts, drives, resumes, cancels operations; one operation's waves at a time per call."""

    def __init__(
        self,
        *,
        store: BatchRepository,
        gate: Gate,
        clock: Callable[[], float],
        stopped: Callable[[], str | None],
        registry: Executors | None = None,
        leading: Callable[[], bool] = lambda: True,
        self_approval: bool = False,
    ) -> None:
        """``stopped``: why no step may start now (the kill switch, pause: the operation
        pauses), or None; ``registry``: the executors, to refuse a ``quarantine`` that cannot
        drain and return; ``leading``: whether this replica leads (a standby runs no step and
        writes nothing: the leader goes on); ``self_approval``: whether the person who started
        an operation may approve it (``batch.self_approval``)."""
        self._self_approval = self_approval
        self._leading = leading
        self._registry = registry
        self._store = store
        self._gate = gate
        self._clock = clock
        self._stopped = stopped

    # --- records -----------------------------------------------------------------------------
    def record(self, batch_id: str) -> BatchRecord:
        stored = self._store.batch(batch_id)
        if stored is None:
            known = ", ".join(b.id for b in self._store.batches()) or "none"
            raise BatchError(f"no batch operation {batch_id!r} (known: {known})")
        return BatchRecord(**json.loads(stored.data))

    def nodes(self, batch_id: str) -> dict[str, NodeRecord]:
        return {
            n: NodeRecord(**json.loads(d)) for n, d in self._store.batch_nodes(batch_id).items()
        }

    def _save(self, rec: BatchRecord) -> None:
        self._store.save_batch(
            StoredBatch(rec.id, rec.status, json.dumps(asdict(rec)), rec.created_at)
        )

    def _save_node(self, batch_id: str, name: str, node: NodeRecord) -> None:
        self._store.save_batch_node(batch_id, name, json.dumps(asdict(node)))

    def busy(self) -> dict[str, str]:
        """Nodes held by an operation not finished (name → operation id)."""
        held = {}
        for stored in self._store.batches():
            if stored.status == BatchStatus.CANCELLED:
                continue  # a done one still holds its failed nodes, quarantined
            for name, node in self.nodes(stored.id).items():
                if node.status in (NodeStatus.PENDING, NodeStatus.RUNNING, NodeStatus.FAILED):
                    held[name] = stored.id
        return held

    # --- the operation -----------------------------------------------------------------------
    def start(
        self,
        operation: Operation,
        text: str,
        fleet: FleetView,
        inventory: frozenset[str] | None,
        by: str = "",
        folder: Path | None = None,
    ) -> str:
        """Store ``operation`` (``text``: its file's; ``by``: who starts it; ``folder``: where
        its paths are relative to, None: its file's folder) with its nodes ``pending``;
        refused (``PlanError``) as ``gpuops batch plan`` refuses it, and when a node is in
        another operation. Returns its id."""
        self._check_quarantine(operation)
        busy = self.busy()
        now = self._clock()
        seen = [n if n.name not in busy else _busy(n, busy[n.name]) for n in fleet.nodes()]
        made = plan(operation, seen, inventory)
        digest = hashlib.sha256(f"{operation.name}{now}{text}".encode()).hexdigest()[:6]
        rec = BatchRecord(
            id=f"{operation.name}-{digest}",
            file=operation.file,
            text=text,
            created_at=now,
            order=[n.name for n in seen if matches(operation.targets, n)],
            started_by=by,
            folder=str(folder) if folder is not None else "",
        )
        if operation.approval:
            rec.status = BatchStatus.AWAITING_APPROVAL.value
            rec.why = "waits for an approval"
        for name in rec.order:
            node = next(n for n in seen if n.name == name)
            skipped = next((s for s in made.skipped if s.node == name), None)
            status = NodeStatus.SKIPPED if skipped is not None else NodeStatus.PENDING
            self._save_node(
                rec.id,
                name,
                NodeRecord(
                    status=status.value,
                    was_out=node.unavailable,
                    error=skipped.why if skipped else "",
                ),
            )
        self._save(rec)
        log.info("batch %s: %d nodes, %d skipped", rec.id, len(made.targets), len(made.skipped))
        return rec.id

    def _check_quarantine(self, operation: Operation) -> None:
        name = operation.quarantine
        if self._registry is None or name == "none":
            return
        if name not in self._registry.names():
            known = ", ".join(self._registry.names())
            raise PlanError([f"quarantine: unknown executor {name!r} (known: {known})"])
        verbs = self._registry.verbs(name)
        if verbs is not None and not {"migrate", "resume"} <= verbs:
            raise PlanError(
                [
                    f"quarantine: executor {name!r} does not drain and return a node (migrate,"
                    f" resume); its verbs: {', '.join(sorted(verbs))}"
                ]
            )

    def run(
        self, batch_id: str, fleet: FleetView, halted: Callable[[], str | None] = lambda: None
    ) -> BatchRecord:
        """Drive the operation until it is done, paused or cancelled; returns its record.
        ``halted``: why it must stop now and stay ``running`` (the engine stops, an admin
        cancels it), or None; it stops so too when this replica stops leading: the one that
        runs it next goes on where it stopped."""
        while True:
            rec = self.record(batch_id)
            if rec.status != BatchStatus.RUNNING:
                return rec
            if halted() is not None or not self._leading():
                return rec
            try:
                operation = rec.operation()
            except RulesError as exc:
                return self._pause(rec, f"its file no longer reads: {exc}")
            nodes = self.nodes(batch_id)
            failed = [n for n, r in nodes.items() if r.status == NodeStatus.FAILED]
            if len(failed) - rec.forgiven >= operation.failure_threshold:
                return self._pause(
                    rec,
                    f"failure threshold {operation.failure_threshold} reached:"
                    f" {', '.join(failed)} failed",
                )
            stopped = self._stopped()
            if stopped is not None:
                return self._pause(rec, stopped)
            try:
                wave = self._next_wave(rec, operation, nodes, fleet)
            except FleetError as exc:
                return self._pause(rec, f"the fleet cannot be read: {exc}")
            if wave is None:
                return self.record(batch_id)
            self._run_wave(rec, operation, wave, halted)

    def _next_wave(
        self, rec: BatchRecord, operation: Operation, nodes: dict[str, NodeRecord], fleet: FleetView
    ) -> list[str] | None:
        """The nodes to go through next: those a stop left in the middle first; None when
        the operation ended or paused (stored)."""
        middle = [n for n in rec.order if nodes[n].status == NodeStatus.RUNNING]
        if middle:
            return middle
        pending = [n for n in rec.order if nodes[n].status == NodeStatus.PENDING]
        if not pending:
            self._finish(rec, nodes)
            return None
        seen = list(fleet.nodes())
        held = set()  # failed nodes stay quarantined: out of service, counted
        if operation.quarantine != "none":
            held = {n for n, r in nodes.items() if r.status == NodeStatus.FAILED and not r.was_out}
        counted = [
            n for n in seen if operation.targets.pool is None or n.pool == operation.targets.pool
        ]
        chosen = [n for n in seen if n.name in pending]
        try:
            made = remaining(
                operation,
                seen,
                chosen,
                counted,
                operation.max_unavailable.nodes(len(counted)),
                canary=rec.waves == 0,
                extra_unavailable=held,
            )
        except PlanError as exc:
            self._pause(rec, str(exc))
            return None
        for skipped in made.skipped:
            self._save_node(
                rec.id, skipped.node, NodeRecord(status=NodeStatus.SKIPPED.value, error=skipped.why)
            )
        if not made.waves:
            return self._next_wave(rec, operation, self.nodes(rec.id), fleet)
        wave = made.waves[0]
        rec.timeline.append([self._clock(), rec.waves, wave.unavailable])
        for name in wave.nodes:
            node = nodes[name]
            node.status, node.wave = NodeStatus.RUNNING.value, rec.waves
            self._save_node(rec.id, name, node)
        rec.waves += 1
        self._save(rec)
        log.info(
            "batch %s: wave %d: %s (%d unavailable)",
            rec.id,
            rec.waves - 1,
            ", ".join(wave.nodes),
            wave.unavailable,
        )
        return list(wave.nodes)

    def _run_wave(
        self,
        rec: BatchRecord,
        operation: Operation,
        names: list[str],
        halted: Callable[[], str | None],
    ) -> None:
        """The wave's nodes in parallel; a step held at the gate (a veto, an unwritable
        audit) pauses the operation, saying why; one a halt or a lost lead stopped does not."""
        with ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="batch") as pool:
            futures = [pool.submit(self._procedure, rec, operation, n, halted) for n in names]
            held = [f.result() for f in futures]
        why = [h for h in held if h is not None]
        if why and self._stopped() is None and halted() is None and self._leading():
            self._pause(self.record(rec.id), "; ".join(why))

    def _procedure(
        self,
        rec: BatchRecord,
        operation: Operation,
        name: str,
        halted: Callable[[], str | None],
    ) -> str | None:
        """The node's remaining steps, each stored once done; what held a step, or None.
        With ``on_stop: cancel`` a running step is cancelled as soon as the operation must
        stop; it stays not done, to run again, whole, when the operation goes on."""
        node = self.nodes(rec.id)[name]

        def stop() -> str | None:
            return self._stopped() or halted() or (None if self._leading() else NOT_LEADING)

        cancelled = stop if operation.on_stop is OnStop.CANCEL else None
        for phase in operation.phases(node.was_out):
            if phase.value in node.done:
                continue  # finished before a stop or a restart: never again
            stopped = stop()
            if stopped is not None:
                return stopped  # the kill switch, pause, a halt: between steps
            outcome = self._gate.run_step(
                self._decision(rec, operation, name, node, phase),
                dry_run=not operation.enforce,
                cancelled=cancelled,
                once=phase is Phase.VALIDATE,  # a check that timed out has failed
            )
            if outcome.status is OutcomeStatus.SKIPPED and not (outcome.error or "").startswith(
                DRY_RUN_PREFIX
            ):
                return f"{name}: {outcome.error}"  # held or cancelled: resumed later
            if not outcome.ok and outcome.status is not OutcomeStatus.SKIPPED:
                node.status, node.error = NodeStatus.FAILED.value, f"{phase.value}: {outcome.error}"
                self._save_node(rec.id, name, node)
                log.warning(
                    "batch %s: %s failed at %s: %s", rec.id, name, phase.value, outcome.error
                )
                return None
            node.done.append(phase.value)
            self._save_node(rec.id, name, node)
        node.status = NodeStatus.DONE.value
        self._save_node(rec.id, name, node)
        return None

    def _decision(
        self, rec: BatchRecord, operation: Operation, name: str, node: NodeRecord, phase: Phase
    ) -> Decision:
        now = self._clock()
        policy = f"batch/{rec.id}"
        key = f"node={name}"
        transition = Transition.CLEAR if phase is Phase.RETURN else Transition.FIRE
        return Decision(
            id=decision_id(policy, key, rec.created_at, phase.value, node.attempt),
            policy=policy,
            group="batch",
            target=Target(key=key, labels={"node": name}),
            transition=transition,
            action=_action(operation, phase),
            evidence=Evidence(
                expr=f"batch {rec.id}: {phase.value}",
                value=None,
                pending_since=None,
                observed_at=now,
            ),
            at=now,
            episode_start=rec.created_at,
            repeat=node.attempt,
            reason=f"batch {rec.id}: {phase.value} of {name} (wave {node.wave})",
            mode="enforce" if operation.enforce else "dry-run",
        )

    def stored(self) -> list[StoredBatch]:
        """Every operation of the store, oldest first."""
        return self._store.batches()

    def pause(self, batch_id: str, why: str) -> BatchRecord:
        """Pause the operation, saying why (``resume`` lets it go on)."""
        return self._pause(self.record(batch_id), why)

    def _pause(self, rec: BatchRecord, why: str) -> BatchRecord:
        rec.status, rec.why = BatchStatus.PAUSED.value, why
        self._save(rec)
        log.warning("batch %s paused: %s", rec.id, why)
        return rec

    def _finish(self, rec: BatchRecord, nodes: dict[str, NodeRecord]) -> None:
        failed = sorted(n for n, r in nodes.items() if r.status == NodeStatus.FAILED)
        rec.status = BatchStatus.DONE.value
        rec.why = f"failed: {', '.join(failed)}" if failed else ""
        self._save(rec)
        log.info("batch %s done%s", rec.id, f" ({rec.why})" if failed else "")

    # --- what an admin asks ------------------------------------------------------------------
    def resume(self, batch_id: str) -> BatchRecord:
        rec = self.record(batch_id)
        if rec.status == BatchStatus.PAUSED:
            failed = sum(1 for n in self.nodes(batch_id).values() if n.status == NodeStatus.FAILED)
            rec.status, rec.why, rec.forgiven = BatchStatus.RUNNING.value, "", failed
            self._save(rec)
        elif rec.status != BatchStatus.RUNNING:
            raise BatchError(f"batch operation {batch_id} is {rec.status}: nothing to resume")
        return rec

    def approve(self, batch_id: str, user: str) -> BatchRecord:
        """Let an operation that waits for an approval run (its approver kept in ``why``
        until it ends, and in the engine's log)."""
        rec = self.record(batch_id)
        if rec.status != BatchStatus.AWAITING_APPROVAL:
            raise BatchError(f"batch operation {batch_id} is {rec.status}: nothing to approve")
        if rec.started_by and rec.started_by == user and not self._self_approval:
            raise BatchError(
                f"batch operation {batch_id} was started by {user}: another person approves it"
                " (batch.self_approval: true lets its starter approve)"
            )
        rec.status, rec.why = BatchStatus.RUNNING.value, f"approved by {user}"
        now = self._clock()
        policy = f"batch/{rec.id}"
        self._gate.record(  # audited: who let it run, under the operation's id
            Decision(
                id=decision_id(policy, "operation", rec.created_at, "approve"),
                policy=policy,
                group="batch",
                target=Target(key=f"operation={rec.id}", labels={"operation": rec.id}),
                transition=Transition.FIRE,
                action=None,
                evidence=Evidence(f"batch {rec.id}: approve", None, None, now),
                at=now,
                episode_start=rec.created_at,
                reason=f"batch {rec.id} approved by {user}",
            )
        )
        self._save(rec)
        log.warning("batch %s approved by %s", batch_id, user)
        return rec

    def retry(self, batch_id: str, name: str) -> NodeRecord:
        """Put a failed node back in the queue (its procedure from its quarantine, a new
        attempt: new decision ids)."""
        rec = self.record(batch_id)
        node = self.nodes(batch_id).get(name)
        if node is None or node.status != NodeStatus.FAILED:
            state = "no node of it" if node is None else node.status
            raise BatchError(
                f"{name} of batch operation {batch_id} is {state}: only a failed node is retried"
            )
        node.status, node.error, node.done = NodeStatus.PENDING.value, "", []
        node.attempt += 1
        self._save_node(batch_id, name, node)
        if rec.status == BatchStatus.DONE:
            rec.status, rec.why = BatchStatus.PAUSED.value, f"{name} to retry"
            self._save(rec)
        return node

    def cancel(self, batch_id: str) -> BatchRecord:
        """No node starts again; a node in the middle of its procedure is returned to service
        (unless it was out before), a pending one is marked cancelled, a failed one is let go
        out of service (its step failed: an admin returns it)."""
        rec = self.record(batch_id)
        nodes = self.nodes(batch_id)
        held = any(n.status == NodeStatus.FAILED for n in nodes.values())
        if rec.status == BatchStatus.CANCELLED or (rec.status == BatchStatus.DONE and not held):
            raise BatchError(f"batch operation {batch_id} is {rec.status}: nothing to cancel")
        operation = rec.operation(checked=False)  # returns nodes, runs no playbook
        for name, node in nodes.items():
            if node.status == NodeStatus.PENDING:
                node.status = NodeStatus.CANCELLED.value
            elif node.status == NodeStatus.FAILED:  # its step failed: not put back to work
                node.status = NodeStatus.CANCELLED.value
                node.error = f"left out of service: {node.error}"
            elif node.status == NodeStatus.RUNNING:
                quarantined = Phase.QUARANTINE.value in node.done
                if quarantined and not node.was_out and operation.quarantine != "none":
                    outcome = self._gate.run_step(
                        self._decision(rec, operation, name, node, Phase.RETURN),
                        dry_run=not operation.enforce,
                    )
                    node.error = f"cancelled; returned: {outcome.status.value}"
                node.status = NodeStatus.CANCELLED.value
            else:
                continue
            self._save_node(batch_id, name, node)
        rec.status, rec.why = BatchStatus.CANCELLED.value, "cancelled"
        self._save(rec)
        return rec


def _busy(node: FleetNode, batch_id: str) -> FleetNode:
    return replace(node, busy=batch_id)
