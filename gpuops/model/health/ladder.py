"""The remediation ladder of a quarantined node: a purely computational state machine.

A node whose faulty GPU quarantined it (in a pool whose profile is ``full``) climbs the ladder:
``quarantined`` → ``remediating`` (a step: reset the GPU, then reboot the node) →
``validating`` (a health check) → ``returned`` — or ``needs_human``: no step left, a fault
that calls for a new part, or a second remediation of the node within the window. A node that
needs a human is never remediated again by itself: only an admin's ``clear`` lets it climb
again. A reboot covers a reset: after a reboot no reset is due. A node someone else took back
during its repair leaves the ladder (``left``).

The engine's ladder (``gpuops.runtime.ladder``) keeps each node's ``Repair`` in the store,
asks ``due`` what to do next, runs it through the gate and hands its outcome to ``after``;
nothing here acts, reads a clock or keeps state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuops.model.health.catalogue import Remedy


class Stage(StrEnum):
    """Where a node is on the ladder."""

    HEALTHY = "healthy"
    """Not on the ladder (never was, an admin cleared it, or someone else took it back during
    its repair)."""
    QUARANTINED = "quarantined"
    """Drained by gpuops for a faulty GPU; its remediation has not started."""
    REMEDIATING = "remediating"
    """A step (``Repair.step``) is due or running."""
    VALIDATING = "validating"
    """The health check is due or running; once passed, the return is due."""
    RETURNED = "returned"
    """Given back to the scheduler after a passed health check."""
    NEEDS_HUMAN = "needs_human"
    """Out of service until an admin clears it; never remediated by itself."""


ACTIVE = frozenset({Stage.QUARANTINED, Stage.REMEDIATING, Stage.VALIDATING})
"""The stages of a node the ladder is working on."""
REPAIRING = frozenset({Stage.REMEDIATING, Stage.VALIDATING})
"""The stages of a node whose repair has begun and not ended."""


class Move(StrEnum):
    """What the ladder does next to a node."""

    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    VALIDATE = "validate"
    RETURN = "return"
    HAND_OVER = "hand_over"
    """Tell a human (the webhook, the log, the audit): once per hand-over."""


STEPS: tuple[Move, ...] = (Move.RESET_GPU, Move.REBOOT)
"""The remediation steps, mildest first."""
COVERS: Mapping[Move, frozenset[Move]] = {
    Move.RESET_GPU: frozenset({Move.RESET_GPU}),
    Move.REBOOT: frozenset({Move.REBOOT, Move.RESET_GPU}),
}
"""What a step done makes unnecessary: a reboot resets every GPU of the node."""


@dataclass(frozen=True)
class LadderRules:
    """The ladder's settings as values (``health.ladder`` of the engine configuration)."""

    steps: tuple[Move, ...] = STEPS
    """The remediation steps tried in order (a subset of ``STEPS``)."""
    max_remediations: int = 1
    """Remediated episodes of one node within ``window_s`` after which a new fault goes to a
    human instead (1: a second remediation within the window is a human's)."""
    window_s: float = 7 * 86400.0


@dataclass(frozen=True)
class Quarantine:
    """A quarantine gpuops did for a faulty GPU: what starts a climb."""

    node: str
    gpu: str
    remedy: Remedy
    reason: str
    policy: str
    """The policy whose decision drained the node: its drain reason is gpuops' own, and the
    ladder's actions carry its name so that only that drain is undone."""
    executor: str
    """The executor that drained it: the one that gives it back (``resume``)."""
    decision_id: str
    episode: float
    """When the fault began (the alert's start): with the node, it names the climb."""
    pool: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The node's labels its agent sent (``rack``, ``zone``): its failure domains."""


@dataclass(frozen=True)
class Repair:
    """One node's place on the ladder (stored as JSON after every change)."""

    node: str
    stage: Stage = Stage.HEALTHY
    since: float = 0.0
    """When it entered ``stage``."""
    episode: float = 0.0
    gpu: str = ""
    remedy: str = ""
    reason: str = ""
    """The fault's reason (``XID 79 (...) x1``)."""
    policy: str = ""
    quarantined_by: str = ""
    """The decision id of the quarantine."""
    executor: str = ""
    """The executor that drained the node (and gives it back)."""
    pool: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The node's labels its agent sent with the fault (``rack``, ``zone``)."""
    step: str = ""
    """The remediation step due or running (``remediating``), or the last one."""
    done: tuple[str, ...] = ()
    """The steps done in this climb, in order."""
    passed: bool = False
    """The health check passed: the return is due."""
    told: bool = False
    """A human was told (``needs_human``)."""
    why: str = ""
    """Why the node is where it is (a failed step, the needs-human reason, who cleared it)."""
    returned_at: float | None = None
    """Its last return to service: a fault that began before it never acts."""
    remediated: tuple[float, ...] = ()
    """When each remediated climb of the node began, within the window, oldest first."""
    proven: bool = False
    """Returned, and healthy for the pacing's dwell since: its repair held."""
    quarantined_at: float | None = None
    """When this climb's quarantine reached the ladder (the time to return counts from it)."""
    held_since: float | None = None
    """When pods still on the node began to hold its reboot (``why`` says which)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Repair:
        fields = dict(data)
        fields["stage"] = Stage(fields.get("stage", Stage.HEALTHY))
        fields["done"] = tuple(fields.get("done", ()))
        fields["remediated"] = tuple(float(t) for t in fields.get("remediated", ()))
        fields["labels"] = {str(k): str(v) for k, v in dict(fields.get("labels") or {}).items()}
        return Repair(**fields)


def quarantined(repair: Repair | None, q: Quarantine, now: float) -> tuple[Repair, str]:
    """The node's record after ``q``, and what became of it in words (``""``: a climb
    began). A quarantine of a fault that began before the node's last return, of a node that
    needs a human or one already climbing changes nothing."""
    repair = repair or Repair(q.node)
    if repair.returned_at is not None and q.episode <= repair.returned_at:
        return repair, "the fault began before the node's last return to service: ignored"
    if repair.stage is Stage.NEEDS_HUMAN:
        return repair, "the node needs a human: not remediated until an admin clears it"
    if repair.stage in ACTIVE:
        return repair, f"already on the ladder ({repair.stage.value}, fault {repair.reason})"
    started = replace(
        repair,
        stage=Stage.QUARANTINED,
        since=now,
        episode=q.episode,
        gpu=q.gpu,
        remedy=q.remedy.value,
        reason=q.reason,
        policy=q.policy,
        quarantined_by=q.decision_id,
        executor=q.executor,
        pool=q.pool,
        labels=dict(q.labels),
        step="",
        done=(),
        passed=False,
        told=False,
        why="",
        proven=False,
        quarantined_at=now,
    )
    return started, ""


def steps_for(remedy: str, rules: LadderRules) -> tuple[Move, ...]:
    """The steps that may heal a fault calling for ``remedy``: a reboot's fault skips the
    reset; a part to replace has none."""
    if remedy == Remedy.REPLACE:
        return ()
    if remedy == Remedy.REBOOT_NODE:
        return tuple(s for s in rules.steps if s is not Move.RESET_GPU)
    return rules.steps


def start(repair: Repair, rules: LadderRules, now: float) -> Repair:
    """Begin remediating a quarantined node, or hand it to a human: too many remediations
    within the window, a fault no step heals."""
    assert repair.stage is Stage.QUARANTINED, repair.stage
    recent = tuple(t for t in repair.remediated if t > now - rules.window_s)
    if len(recent) >= rules.max_remediations:
        days = rules.window_s / 86400.0
        return _needs_human(
            replace(repair, remediated=recent),
            now,
            f"{len(recent)} remediation(s) of {repair.node} within {days:g} days already:"
            f" another fault ({repair.reason}) is a human's",
        )
    steps = steps_for(repair.remedy, rules)
    if not steps:
        why = f"{repair.reason} calls for {repair.remedy}: no remediation step heals it"
        return _needs_human(replace(repair, remediated=recent), now, why)
    return replace(
        repair,
        stage=Stage.REMEDIATING,
        since=now,
        step=steps[0].value,
        remediated=(*recent, now),
        why="",
    )


def unproven(repair: Repair) -> bool:
    """Whether ``repair`` is a repair begun and not yet proven: climbing, or returned and not
    healthy for the dwell yet."""
    return repair.stage in REPAIRING or (repair.stage is Stage.RETURNED and not repair.proven)


def due(repair: Repair) -> Move | None:
    """What the ladder does next to ``repair``'s node (None: nothing now; a quarantined node
    waits for ``start``)."""
    if repair.stage is Stage.REMEDIATING:
        return Move(repair.step)
    if repair.stage is Stage.VALIDATING:
        return Move.RETURN if repair.passed else Move.VALIDATE
    if repair.stage is Stage.NEEDS_HUMAN and not repair.told:
        return Move.HAND_OVER
    return None


def after(
    repair: Repair, move: Move, ok: bool, note: str, rules: LadderRules, now: float
) -> Repair:
    """The record once ``move`` ended (``ok``; ``note``: what its outcome said)."""
    if move is Move.HAND_OVER:
        return replace(repair, told=True)
    if move is Move.RETURN:
        if ok:
            return replace(
                repair, stage=Stage.RETURNED, since=now, returned_at=now, why=note or "returned"
            )
        return _needs_human(repair, now, f"the return to service failed: {note}")
    if move is Move.VALIDATE:
        if ok:
            return replace(repair, passed=True, why="")
        return _next_step(
            repair, rules, now, f"the health check failed after {_done(repair)}: {note}"
        )
    assert move in STEPS, move
    if ok:
        return replace(
            repair, stage=Stage.VALIDATING, since=now, done=(*repair.done, move.value), why=""
        )
    return _next_step(repair, rules, now, f"{move.value} failed: {note}")


def left(repair: Repair, why: str, now: float) -> Repair:
    """Someone else took the node back during its repair (``why``: their uncordon): off the
    ladder, as if returned (a fault that began before never acts); neither proven nor failed."""
    return replace(
        repair,
        stage=Stage.HEALTHY,
        since=now,
        returned_at=now,
        why=f"left the remediation ladder: {why}",
    )


def clear(repair: Repair, by: str, now: float) -> Repair:
    """An admin's word that a node that needed a human may climb again (its remediations so
    far are forgotten); ``ValueError`` for a node that does not need one."""
    if repair.stage is not Stage.NEEDS_HUMAN:
        raise ValueError(
            f"node {repair.node} is {repair.stage.value}: only a node that needs a human is cleared"
        )
    return replace(repair, stage=Stage.HEALTHY, since=now, remediated=(), why=f"cleared by {by}")


def _next_step(repair: Repair, rules: LadderRules, now: float, why: str) -> Repair:
    covered: set[Move] = set()
    for step in repair.done:
        covered |= COVERS[Move(step)]
    steps = steps_for(repair.remedy, rules)
    current = Move(repair.step) if repair.step else None
    later = steps[steps.index(current) + 1 :] if current in steps else steps
    left = [s for s in later if s not in covered]
    if not left:
        return _needs_human(repair, now, f"{why}; no step left")
    return replace(repair, stage=Stage.REMEDIATING, since=now, step=left[0].value, why=why)


def _needs_human(repair: Repair, now: float, why: str) -> Repair:
    return replace(repair, stage=Stage.NEEDS_HUMAN, since=now, told=False, why=why)


def _done(repair: Repair) -> str:
    return ", ".join(repair.done) or "no step"
