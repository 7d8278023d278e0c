"""A pool's node group through the ``scale`` subresource, for the ``kubernetes`` executor
(``gpuops.actions.kubernetes``, its ``scale_out`` and ``scale_in``): the pool's resource
(``executors.kubernetes.pools``: a Cluster API MachineDeployment, or any resource serving
``/scale``) gets or gives back replicas, never above ``max_replicas``, and scale-in takes back
only replicas gpuops added (``gpuops.io/scaled-out``).

The mark comes first (``gpuops.io/scaled-out``, ``gpuops.io/decision``, the replicas before in
``gpuops.io/previous-replicas`` and after in ``gpuops.io/replicas``: one patch with the object's
``resourceVersion``), then the ``/scale`` PUT (with the ``resourceVersion`` the patch returned:
a change in between is a 409, read again). A decision found in the mark ran before: its PUT is
made if a crash came between the two (the replicas still those before), never twice.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from gpuops.actions.base import PermanentError
from gpuops.actions.encoding import printable
from gpuops.actions.results import Result
from gpuops.integrations.kubernetes import names
from gpuops.integrations.kubernetes.client import CONFLICT_RETRIES, KubeClient, KubeConflict
from gpuops.model.decisions import Decision
from gpuops.model.verbs import ScaleParams


class PoolSettings(BaseModel):
    """The scalable resource of one pool: any resource serving ``/scale``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str
    name: str
    group: str = "cluster.x-k8s.io"
    version: str = "v1beta2"
    """The version the API server serves the resource at (Cluster API 1.11 and later store
    ``v1beta2``; ``v1beta1`` is served only through its conversion webhook)."""
    plural: str = "machinedeployments"
    max_replicas: int = Field(ge=0)
    """Never scaled above this."""


class Scaled(Result):
    pool: str
    replicas: int
    previous: int
    scaled_out: int
    """Replicas gpuops added and has not taken back, after this decision."""
    already: bool | None = None
    why: str | None = None


def scale_pool(
    client: KubeClient,
    pools: dict[str, PoolSettings],
    d: Decision,
    params: ScaleParams,
    sign: int,
) -> Scaled:
    """Add (``sign`` 1) or take back (-1) ``params.nodes`` replicas of the target's pool."""
    pool_name = d.target.labels.get("pool") or params.pool or ""
    pool = pools.get(pool_name)
    if pool is None:
        known = ", ".join(sorted(pools)) or "none"
        raise PermanentError(
            f"pool {printable(pool_name)} has no scalable resource in "
            f"executors.kubernetes.pools (configured: {known})"
        )
    where = (pool.group, pool.version, pool.plural, pool.namespace, pool.name)
    for _ in range(CONFLICT_RETRIES):
        obj = client.get(*where)
        annotations = obj["metadata"].get("annotations") or {}
        added = max(0, int(annotations.get(names.SCALED_OUT) or 0))
        scale = client.scale(*where)
        replicas = int(scale["spec"].get("replicas") or 0)
        if annotations.get(names.DECISION) == d.id:  # ran before: finished if it was not
            before = int(annotations.get(names.PREVIOUS_REPLICAS) or replicas)
            target = int(annotations.get(names.REPLICAS) or replicas)
            if replicas == before != target:
                scale["spec"]["replicas"] = target
                client.replace_scale(*where, scale)
                replicas = target
            return Scaled(
                pool=pool_name, replicas=replicas, previous=before, scaled_out=added, already=True
            )
        if sign > 0:
            step = max(0, min(params.nodes, pool.max_replicas - replicas))  # never down
            why = None if step > 0 else f"at its maximum ({pool.max_replicas} replicas)"
        else:
            step = -max(0, min(params.nodes, added, replicas))  # never up
            why = None if step < 0 else "gpuops added no replica it has not taken back"
        if step == 0:
            return Scaled(
                pool=pool_name, replicas=replicas, previous=replicas, scaled_out=added, why=why
            )
        patch = {
            "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "annotations": {
                    names.SCALED_OUT: str(added + step),
                    names.PREVIOUS_REPLICAS: str(replicas),
                    names.REPLICAS: str(replicas + step),
                    names.DECISION: d.id,
                    names.AT: _now(),
                },
            }
        }
        try:
            marked = client.patch(*where, patch)
            scale["metadata"]["resourceVersion"] = marked["metadata"]["resourceVersion"]
            scale["spec"]["replicas"] = replicas + step
            client.replace_scale(*where, scale)
        except KubeConflict:
            continue
        return Scaled(
            pool=pool_name, replicas=replicas + step, previous=replicas, scaled_out=added + step
        )
    raise KubeConflict(f"{pool.plural} {pool.namespace}/{pool.name} kept changing")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
