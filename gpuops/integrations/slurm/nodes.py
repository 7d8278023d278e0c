"""What a Slurm node's state means to gpuops: one word per node, read from the node records
``SlurmClient.nodes`` returns (``scontrol show node --json``). Read by the Slurm exporter
(``gpuops.exporters.slurm.collector``) and the ``slurm`` executor (``gpuops.actions.slurm``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def node_state(node: Mapping[str, Any]) -> str:
    """One state word per node: idle, mixed, allocated, draining, drained, down,
    powered_down, powering_up, powering_down, or Slurm's own word for anything else."""
    state = str(node.get("state") or "unknown").lower()
    flags = {str(f).upper() for f in node.get("state_flags") or []}
    if "POWERED_DOWN" in flags:
        return "powered_down"
    if "POWERING_UP" in flags:
        return "powering_up"
    if "POWERING_DOWN" in flags:
        return "powering_down"
    if state == "down":
        return "down"
    if "DRAIN" in flags:
        return "draining" if state in ("allocated", "mixed") else "drained"
    return state
