"""The plan of a batch operation over a fleet: which nodes it targets, the nodes skipped and
why, the waves (the canary first), the nodes unavailable and the GPUs kept available in each,
and the expected duration — or every reason it cannot run, each naming its field.

Pure. ``gpuops batch plan`` prints a whole plan; the engine's batch runner plans again before
each wave over the fleet as it is then (``remaining``), so that a node that became unavailable
meanwhile, for any reason, counts against ``max_unavailable``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpuops.model.batch.operation import Availability, FleetNode, Operation, Targets


class PlanError(ValueError):
    """An operation that cannot run over this fleet; ``problems`` names each field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Skipped:
    node: str
    why: str


@dataclass(frozen=True)
class Wave:
    """Nodes that go through the procedure together."""

    index: int
    nodes: tuple[str, ...]
    canary: bool
    unavailable: int
    """Nodes out of service while it runs: those already out plus its own up nodes."""
    gpus_available: int
    """GPUs of the counted nodes that stay in service while it runs."""
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class Plan:
    operation: Operation
    targets: tuple[str, ...]
    """The nodes the operation goes through, in order."""
    skipped: tuple[Skipped, ...]
    counted: int
    """The nodes ``max_unavailable`` counts: the targets' pool, or the whole fleet."""
    budget: int
    """``max_unavailable`` in nodes."""
    already_unavailable: tuple[str, ...]
    """Counted nodes out of service before the operation, for any reason."""
    kept_drained: tuple[str, ...]
    """Targets out of service before the operation: they stay so after it."""
    gpus_total: int
    waves: tuple[Wave, ...]

    @property
    def duration_s(self) -> float:
        return sum(w.duration_s for w in self.waves)


def per_node_s(operation: Operation) -> float:
    """How long one node is expected to take through the whole procedure."""
    t = operation.timing
    total = t.quarantine_s + t.step_s + t.return_s
    if operation.reboot is not None:
        total += t.reboot_s
    if operation.validate is not None:
        total += t.validate_s
    return total


def matches(targets: Targets, node: FleetNode) -> bool:
    """Whether ``node`` is one of ``targets`` (a list names it; otherwise every criterion)."""
    if targets.nodes:
        return node.name in targets.nodes
    if targets.pool is not None and node.pool != targets.pool:
        return False
    if not targets.features <= node.features:
        return False
    return all(node.labels.get(k) == v for k, v in targets.labels.items())


def _select(
    operation: Operation, fleet: Sequence[FleetNode], problems: list[str]
) -> list[FleetNode]:
    targets = operation.targets
    names = {n.name for n in fleet}
    if targets.nodes:
        unknown = [n for n in targets.nodes if n not in names]
        if unknown:
            problems.append(
                f"targets.nodes: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'}"
                f" no node of the fleet ({len(fleet)} nodes)"
            )
    chosen = [n for n in fleet if matches(targets, n)]
    if not chosen:
        if not (targets.nodes and problems):
            problems.append(
                f"targets: {targets.describe()} matches no node of the fleet ({len(fleet)} nodes)"
            )
    elif not targets.nodes and len(chosen) == len(fleet) > 1 and not targets.everything:
        problems.append(
            f"targets: {targets.describe()} matches every node of the fleet ({len(fleet)});"
            " say `all: true` under targets to mean it"
        )
    return chosen


def _skip_reason(operation: Operation, node: FleetNode) -> str | None:
    label = operation.skip_label
    if label in node.labels or label in node.features:
        return f"skip label {label}"
    if node.availability is Availability.DOWN:
        return f"down ({node.reason})" if node.reason else "down"
    return None


def plan(
    operation: Operation,
    fleet: Sequence[FleetNode],
    inventory: Collection[str] | None = None,
) -> Plan:
    """The whole plan of ``operation`` over ``fleet``; ``inventory``: the hosts of the step's
    Ansible inventory (None: no inventory). ``PlanError`` lists every problem."""
    problems: list[str] = []
    chosen = _select(operation, fleet, problems)
    if inventory is not None:
        missing = sorted(n.name for n in chosen if n.name not in inventory)
        if missing:
            problems.append(
                f"step.inventory: {operation.step.inventory} does not match the targets: it"
                f" lacks {', '.join(missing[:10])}{' …' if len(missing) > 10 else ''}"
                f" ({len(missing)} of {len(chosen)})"
            )
    busy = [f"{n.name} (in {n.busy})" for n in chosen if n.busy]
    if busy:
        problems.append(
            f"targets: {', '.join(busy)}: a node is in one operation at a time; wait for it to"
            " finish or leave the node out"
        )
    counted = [
        n for n in fleet if operation.targets.pool is None or n.pool == operation.targets.pool
    ]
    budget = operation.max_unavailable.nodes(len(counted))
    if chosen and budget < 1:
        problems.append(
            f"max_unavailable: {operation.max_unavailable.describe()} of {len(counted)} nodes"
            " leaves no room for one node"
        )
    if problems:
        raise PlanError(problems)
    return remaining(operation, fleet, chosen, counted, budget)


def remaining(
    operation: Operation,
    fleet: Sequence[FleetNode],
    chosen: Sequence[FleetNode],
    counted: Sequence[FleetNode],
    budget: int,
    canary: bool = True,
    extra_unavailable: Collection[str] = (),
) -> Plan:
    """The waves of ``chosen`` with the fleet as it is now: every counted node out of service
    (or named in ``extra_unavailable``: held by the operation itself) takes room; ``canary``:
    the first wave is the canary. ``PlanError`` when no room is left for an up node."""
    skipped = []
    todo = []
    for node in chosen:
        why = _skip_reason(operation, node)
        if why is None:
            todo.append(node)
        else:
            skipped.append(Skipped(node.name, why))
    out = sorted({n.name for n in counted if n.unavailable} | set(extra_unavailable))
    kept = tuple(n.name for n in todo if n.availability is Availability.DRAINED)
    room = budget - len(out)
    if room < 1 and any(not n.unavailable for n in todo):
        shown = ", ".join(out[:10]) + (" …" if len(out) > 10 else "")
        raise PlanError(
            [
                f"max_unavailable: {operation.max_unavailable.describe()} of {len(counted)} nodes"
                f" is {budget}, and {len(out)} {'is' if len(out) == 1 else 'are'} unavailable"
                f" already ({shown}): no room for one node"
            ]
        )
    gpus_total = sum(n.gpus for n in counted)
    gpus_up = sum(n.gpus for n in counted if not n.unavailable and n.name not in extra_unavailable)
    waves: list[Wave] = []
    queue = list(todo)
    each = per_node_s(operation)
    start = 0.0
    first = canary and operation.canary > 0
    while queue:
        size = min(operation.canary, operation.max_parallel) if first else operation.max_parallel
        size = max(size, 1)
        wave: list[FleetNode] = []
        new = 0
        rest = []
        for node in queue:
            fits = len(wave) < size and (node.unavailable or new < room)
            if fits:
                wave.append(node)
                new += 0 if node.unavailable else 1
            else:
                rest.append(node)
        queue = rest
        taken = sum(
            n.gpus for n in wave if not n.unavailable and n.name in {c.name for c in counted}
        )
        waves.append(
            Wave(
                index=len(waves),
                nodes=tuple(n.name for n in wave),
                canary=first,
                unavailable=len(out) + new,
                gpus_available=gpus_up - taken,
                start_s=start,
                duration_s=each,
            )
        )
        start += each
        first = False
    return Plan(
        operation=operation,
        targets=tuple(n.name for n in todo),
        skipped=tuple(skipped),
        counted=len(counted),
        budget=budget,
        already_unavailable=tuple(out),
        kept_drained=kept,
        gpus_total=gpus_total,
        waves=tuple(waves),
    )
