"""What a fleet file asks of its pools: reservations they can hold, job classes some pool
can take. A file that passes these never hands the running fleet a job it must refuse.

Called by ``gpuops.sim.fleet.fleetfile.checks``; each problem is (the key's path, what is
wrong), naming the project or job class and the pools concerned. The pool a job may run in
is decided by ``gpuops.sim.fleet.config.candidate_pools``, the function the cluster uses.
"""

from __future__ import annotations

from gpuops.sim.fleet.config import GPU_MODELS, PoolSpec, candidate_pools
from gpuops.sim.fleet.fleetfile.positions import Path_
from gpuops.sim.fleet.fleetfile.schema import _FleetFile, _JobClass, _Pool, _PriorityClass


def capacity(pool: _Pool) -> int | None:
    """GPUs a reservation in ``pool`` can be held on: an owned pool's nodes, a cloud pool's
    ``max_nodes`` (None: a cloud pool without a cap)."""
    if not pool.cloud:
        return pool.nodes * pool.gpus_per_node
    if pool.max_nodes is None:
        return None
    return pool.max_nodes * pool.gpus_per_node


def _has(pool: _Pool, cap: int) -> str:
    if pool.cloud:
        return f"which max_nodes caps at {cap} ({pool.max_nodes} nodes of {pool.gpus_per_node})"
    return f"which has {cap}"


def reservation_problems(doc: _FleetFile) -> list[tuple[Path_, str]]:
    """A project reserving more than a pool holds, named at its own line; projects that
    together reserve more, named at the line of the one that tips the pool over."""
    out: list[tuple[Path_, str]] = []
    pools = {p.name: p for p in doc.pools}
    totals: dict[str, list[tuple[str, int]]] = {}
    for i, project in enumerate(doc.projects):
        for pool_name, gpus in project.reserved.items():
            pool = pools.get(pool_name)
            if pool is None or gpus < 0:
                continue  # reported by the caller
            cap = capacity(pool)
            where: Path_ = ("projects", i, "reserved", pool_name)
            if cap is not None and gpus > cap:
                out.append(
                    (
                        where,
                        f"project {project.name!r} reserves {gpus} GPUs of pool "
                        f"{pool_name!r}, {_has(pool, cap)}",
                    )
                )
                continue
            before = totals.setdefault(pool_name, [])
            total = sum(g for _, g in before) + gpus
            if cap is not None and total > cap >= total - gpus:
                named = ", ".join(f"{n!r} ({g})" for n, g in [*before, (project.name, gpus)])
                out.append(
                    (
                        where,
                        f"projects {named} reserve {total} GPUs of pool {pool_name!r}, "
                        f"{_has(pool, cap)}",
                    )
                )
            before.append((project.name, gpus))
    return out


def _spec(pool: _Pool) -> PoolSpec:
    return PoolSpec(pool.name, pool.nodes, pool.gpus_per_node, pool.model, pool.cloud)


def job_class_problems(doc: _FleetFile) -> list[tuple[Path_, str]]:
    """Job classes that draw a job no pool can take (too many GPUs for every node, more
    memory than every model, only models no pool has and no fallback, or those together)."""
    out: list[tuple[Path_, str]] = []
    pools = [_spec(p) for p in doc.pools if p.model in GPU_MODELS]
    classes = {c.name: c for c in doc.priority_classes}
    for i, jc in enumerate(doc.job_classes):
        pc = classes.get(jc.priority_class)
        if pc is None or not pools:
            continue  # reported by the caller
        problem = _no_pool(jc, pc, pools)
        if problem is not None:
            key, message = problem
            out.append((("job_classes", i, *key), f"job class {jc.name!r}: {message}"))
    return out


def _no_pool(
    jc: _JobClass, pc: _PriorityClass, pools: list[PoolSpec]
) -> tuple[tuple[str, ...], str] | None:
    """The first reason a GPU count the class draws fits no pool, and the key it is on."""
    models = tuple(pc.models)
    sized = sorted({g for g, w in jc.gpus.items() if w > 0})
    widest = max(p.gpus_per_node for p in pools)
    too_big = [g for g in sized if g > widest]
    if too_big:
        return ("gpus",), f"{too_big} GPUs exceed every node ({widest} GPUs)"
    memory = jc.memory_gib
    if memory is not None and not candidate_pools(pools, (), True, 1, memory):
        return ("memory_gib",), f"{memory:g} GiB fits no pool's GPUs"
    if models and not pc.fallback and not candidate_pools(pools, models, False, 1, None):
        have = ", ".join(sorted({p.model for p in pools}))
        return (
            ("priority_class",),
            f"priority class {pc.name!r} takes only {', '.join(models)} (fallback: false) "
            f"and no pool has them (pools have {have})",
        )
    for gpus in sized:
        if not candidate_pools(pools, models, pc.fallback, gpus, memory):
            allowed = "" if pc.fallback or not models else f" of {', '.join(models)}"
            need = f" with {memory:g} GiB each" if memory is not None else ""
            return (
                (),
                f"no pool{allowed} has nodes of {gpus} GPUs{need} (priority class "
                f"{pc.name!r}{', fallback: false' if not pc.fallback else ''})",
            )
    return None
