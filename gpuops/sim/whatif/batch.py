"""A batch operation file as a rollout of the simulated fleet (``gpuops whatif --batch``): its
targets, canary, budgets and timing over the fleet file's nodes, planned as ``gpuops batch
plan`` plans it (the same refusals, naming the field), for ``gpuops.sim.fleet.rollout``.

Called by ``gpuops.cli.whatif``; the rollout runs in the policies-on run
(``gpuops.sim.whatif.runs.run_on``).
"""

from __future__ import annotations

from pathlib import Path

from gpuops.model.batch.operation import FleetNode, Operation, StepKind
from gpuops.model.batch.opfile import load_operation
from gpuops.model.batch.plan import PlanError, plan
from gpuops.model.rules.model import RulesError
from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.rollout import RolloutSpec
from gpuops.sim.whatif.errors import WhatifError

DRIVER_VARS = ("driver_version", "version")
"""The step's ``extra_vars`` read as the driver version the nodes have after it."""


def fleet_nodes(config: FleetConfig) -> list[FleetNode]:
    """The fleet file's nodes as the simulated cluster names them at its start (``node-N``
    in pool order), each up."""
    nodes: list[FleetNode] = []
    for pool in config.pools:
        for _ in range(pool.nodes):
            nodes.append(FleetNode(f"node-{len(nodes)}", pool=pool.name, gpus=pool.gpus_per_node))
    return nodes


def driver_version(operation: Operation) -> str | None:
    if operation.step.kind is not StepKind.ANSIBLE:
        return None
    given = operation.step.extra_vars
    return next((given[k] for k in DRIVER_VARS if k in given), None)


def rollout_spec(path: Path, config: FleetConfig, at_hours: float) -> RolloutSpec:
    """The rollout of the operation file at ``path`` over ``config``'s nodes, starting
    ``at_hours`` into the run; ``WhatifError`` names every problem (the file's line and
    field, or the plan's field)."""
    try:
        operation = load_operation(path)
    except RulesError as exc:
        problems = "; ".join(str(e) for e in exc.errors)
        raise WhatifError(f"--batch: {problems}") from None
    nodes = fleet_nodes(config)
    try:
        made = plan(operation, nodes, None)  # the inventory is the real fleet's, not this one
    except PlanError as exc:
        raise WhatifError(f"--batch {path}: {'; '.join(exc.problems)}") from None
    timing = operation.timing
    return RolloutSpec(
        name=operation.name,
        targets=made.targets,
        at_s=at_hours * 3600.0,
        canary=operation.canary,
        max_parallel=operation.max_parallel,
        budget=made.budget,
        counted=operation.targets.pool,
        drain=operation.quarantine != "none",
        quarantine_s=timing.quarantine_s if operation.quarantine != "none" else 0.0,
        step_s=timing.step_s,
        reboot_s=timing.reboot_s if operation.reboot is not None else 0.0,
        validate_s=timing.validate_s if operation.validate is not None else 0.0,
        return_s=timing.return_s if operation.quarantine != "none" else 0.0,
        driver_version=driver_version(operation),
    )
