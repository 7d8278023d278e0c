"""What a batch operation is: its targets, the per-node procedure, its canary and budgets, and
the nodes it is planned over.

Frozen values read from an operation file by ``gpuops.model.batch.opfile`` and planned by
``gpuops.model.batch.plan``. A node goes through the procedure in order: quarantine (a Slurm
drain or a Kubernetes cordon and drain) → the step (an Ansible playbook or a command) → a
reboot if asked → the validation → back to service (unless it was out of service before).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

EMPTY: Mapping[str, str] = MappingProxyType({})

SKIP_LABEL = "gpuops.io/batch-skip"
"""A node label (or Slurm feature) that keeps a node out of every operation (reported as
skipped)."""


class StepKind(StrEnum):
    """What the step of each node runs."""

    ANSIBLE = "ansible"
    """An Ansible playbook, run by ansible-runner limited to the node."""
    COMMAND = "command"
    """A command (argv) run for the node; ``{node}`` in an argument is the node's name."""


class Phase(StrEnum):
    """The per-node procedure, in order."""

    QUARANTINE = "quarantine"
    STEP = "step"
    REBOOT = "reboot"
    VALIDATE = "validate"
    RETURN = "return"


@dataclass(frozen=True)
class Targets:
    """Which nodes: a list of names, or every node matching a pool, features and labels (all
    of those given); ``everything``: the operation means the whole fleet."""

    nodes: tuple[str, ...] = ()
    pool: str | None = None
    features: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    everything: bool = False

    def describe(self) -> str:
        if self.nodes:
            return f"nodes {', '.join(self.nodes)}"
        parts = []
        if self.pool is not None:
            parts.append(f"pool {self.pool}")
        if self.features:
            parts.append(f"features {','.join(sorted(self.features))}")
        if self.labels:
            parts.append(", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        return " and ".join(parts) if parts else "every node"


@dataclass(frozen=True)
class Step:
    """What runs on each node after its quarantine."""

    kind: StepKind
    playbook: str | None = None
    """The playbook (``ansible``), as written in the operation file."""
    inventory: str | None = None
    """The Ansible inventory (``ansible``): every target node must be a host of it."""
    extra_vars: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    command: tuple[str, ...] = ()
    """The argv (``command``)."""
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class Validation:
    """The health gate after the step (and reboot): a command whose exit status 0 passes."""

    command: tuple[str, ...]
    timeout_s: float = 600.0
    """The GPU Operator's validation timeout by default."""


@dataclass(frozen=True)
class Timing:
    """How long each phase is expected to take (for the plan's expected duration)."""

    quarantine_s: float = 60.0
    step_s: float = 600.0
    reboot_s: float = 300.0
    validate_s: float = 120.0
    return_s: float = 10.0


@dataclass(frozen=True)
class Budget:
    """``max_unavailable``: a number of nodes, or a percentage of the nodes counted (the
    targets' pool, or the targets), rounded down."""

    count: int | None = None
    percent: float | None = None

    def nodes(self, counted: int) -> int:
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return int(counted * self.percent / 100.0 + 1e-9)

    def describe(self) -> str:
        return str(self.count) if self.count is not None else f"{self.percent:g}%"


class OnStop(StrEnum):
    """What a step that is running does when the kill switch or pause turns on, the engine
    stops or loses its lead, or an admin cancels the operation."""

    FINISH = "finish"
    """It runs to its end; no next step starts."""
    CANCEL = "cancel"
    """It is stopped (an Ansible run cancelled, a command's process group killed) and runs
    again, whole, when the operation goes on."""


@dataclass(frozen=True)
class Operation:
    """One batch operation as its file says it."""

    name: str
    targets: Targets
    step: Step
    validate: Validation | None = None
    reboot: Step | None = None
    """The reboot after the step (a playbook such as the shipped ``reboot.yml``, or a command);
    None: no reboot."""
    quarantine: str = "scheduler"
    """The executor that drains a node and returns it (``migrate``, then ``resume``): the
    logical ``scheduler`` (Slurm or Kubernetes, as the engine maps it), ``slurm`` or
    ``kubernetes``; ``none``: the step runs on a node left in service."""
    canary: int = 1
    max_parallel: int = 1
    """The GPU Operator's ``maxParallelUpgrades`` default."""
    max_unavailable: Budget = Budget(percent=25.0)
    """The GPU Operator's ``maxUnavailable`` default."""
    failure_threshold: int = 1
    """Failed nodes (step or validation) that pause the operation."""
    enforce: bool = False
    """False: dry-run (each step is audited as what it would do; nothing runs)."""
    approval: bool = False
    """True: the operation waits for an approval before its first node."""
    skip_label: str = SKIP_LABEL
    timing: Timing = Timing()
    on_stop: OnStop = OnStop.FINISH
    file: str = ""

    def phases(self, was_out: bool) -> list[Phase]:
        """A node's procedure, in order; ``was_out``: out of service before the operation
        (never returned to service by it)."""
        phases = [Phase.QUARANTINE] if self.quarantine != "none" else []
        phases.append(Phase.STEP)
        if self.reboot is not None:
            phases.append(Phase.REBOOT)
        if self.validate is not None:
            phases.append(Phase.VALIDATE)
        if self.quarantine != "none" and not was_out:
            phases.append(Phase.RETURN)
        return phases


class Availability(StrEnum):
    """A node as the fleet reports it before the operation."""

    UP = "up"
    DRAINED = "drained"
    """Out of service by someone else's hand (drained, cordoned): it stays so after."""
    DOWN = "down"
    """Not answering (NotReady, down, not responding): skipped, counted as unavailable."""


@dataclass(frozen=True)
class FleetNode:
    """One node of the fleet the operation is planned over."""

    name: str
    pool: str = ""
    gpus: int = 0
    features: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    availability: Availability = Availability.UP
    reason: str = ""
    """Why it is drained or down, as the fleet says."""
    busy: str = ""
    """The operation that holds it, if another one does."""

    @property
    def unavailable(self) -> bool:
        return self.availability is not Availability.UP
