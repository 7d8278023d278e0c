"""How the simulated fleet's nodes answer the remediation ladder's steps: a GPU reset, a
reboot and a health check, and how long each keeps the node out of service.

``Cluster.health`` answers them (``gpuops.sim.fleet.operations``: ``reset_gpu``, ``reboot``,
``validate``); by default every node is healthy (``Healthy``). The what-if's fault injection
(``gpuops.sim.faults.FaultState``) answers as a node with open faults does.
"""

from __future__ import annotations

from typing import Protocol

RESET_S = 60.0
"""Virtual seconds a GPU reset keeps its node out of service (``nvidia-smi --gpu-reset`` and
the node agent's checks around it)."""
REBOOT_S = 600.0
"""Virtual seconds a reboot keeps its node out of service: a GPU server's firmware, boot and
driver load until its scheduler daemon is back."""
VALIDATE_S = 120.0
"""Virtual seconds a health check takes (DCGM's quick diagnostic, ``dcgmi diag -r 1``)."""


class NodeHealth(Protocol):
    """What a node's GPUs say to the ladder's steps."""

    def reset_gpu(self, node: str, gpu: str, at: float) -> bool:
        """Reset ``gpu`` of ``node`` at ``at``; whether the node is healthy after."""
        ...

    def reboot(self, node: str, at: float) -> bool:
        """Reboot ``node`` at ``at``; whether it is healthy after."""
        ...

    def validate(self, node: str) -> tuple[bool, str]:
        """Whether ``node`` passes a health check, and why not."""
        ...


class Healthy:
    """Every node healthy: every step succeeds, every check passes."""

    def reset_gpu(self, node: str, gpu: str, at: float) -> bool:
        return True

    def reboot(self, node: str, at: float) -> bool:
        return True

    def validate(self, node: str) -> tuple[bool, str]:
        return True, ""
