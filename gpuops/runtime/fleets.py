"""The fleet a batch operation is planned over, as it is now: a nodes file (read again at each
call) or Slurm (``sinfo --json``). Each is a ``gpuops.runtime.batch.FleetView``.

Built by the facade from the configuration's ``batch`` (the fleet of the operations the engine
hosts) and by ``gpuops batch`` from ``--nodes`` or ``--slurm``. A fleet that cannot be read
raises ``FleetError`` naming the file or Slurm's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuops.integrations.slurm.client import SlurmClient, SlurmError, gres_gpus
from gpuops.integrations.slurm.nodes import node_state
from gpuops.model.batch.nodefile import load_nodes
from gpuops.model.batch.operation import Availability, FleetNode
from gpuops.model.rules.model import RulesError
from gpuops.settings import BatchSettings


class FleetError(RuntimeError):
    """The fleet cannot be read now; the message names the file or what Slurm answered."""


class NodesFile:
    """The fleet as a nodes file says it is, read again at each call (whoever keeps the file
    keeps it current; a file replaced whole is read whole)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def nodes(self) -> Sequence[FleetNode]:
        try:
            return load_nodes(self.path)
        except RulesError as exc:
            raise FleetError("; ".join(str(e) for e in exc.errors)) from None


class SlurmFleet:
    """The fleet as Slurm says it is now (``sinfo --json``): a node's first partition is its
    pool, its features and GPUs (gres) as configured; drained or draining is out of service
    (by its reason's hand), down or powered down is down."""

    def __init__(self, conf: str | None) -> None:
        self._client = SlurmClient(conf=conf)

    def nodes(self) -> Sequence[FleetNode]:
        try:
            found = self._client.nodes()
        except SlurmError as exc:
            raise FleetError(f"slurm: {exc}") from None
        nodes = []
        for node in found:
            state = node_state(node)
            availability = Availability.UP
            if state in ("drained", "draining"):
                availability = Availability.DRAINED
            elif state in ("down", "powered_down", "powering_down"):
                availability = Availability.DOWN
            features = node.get("features") or node.get("active_features") or []
            if isinstance(features, str):
                features = [f for f in features.split(",") if f]
            partitions = node.get("partitions") or [""]
            nodes.append(
                FleetNode(
                    name=str(node.get("name")),
                    pool=str(partitions[0]),
                    gpus=gres_gpus(str(node.get("gres") or "")),
                    features=frozenset(str(f) for f in features),
                    availability=availability,
                    reason=str(node.get("reason") or ""),
                )
            )
        return nodes


def configured_fleet(settings: BatchSettings) -> NodesFile | SlurmFleet | None:
    """The fleet ``batch`` names (None: none, the engine hosts no operation)."""
    if settings.nodes is not None:
        return NodesFile(settings.nodes)
    if settings.slurm:
        return SlurmFleet(str(settings.slurm_conf) if settings.slurm_conf else None)
    return None
