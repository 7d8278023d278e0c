"""Checks across the sections of a fleet file, after each section has passed its schema: names
that exist and are unique, quotas within their pools and job classes some pool can take
(``gpuops.sim.fleet.fleetfile.fits``), initial jobs on nodes that exist.

Called by ``gpuops.sim.fleet.fleetfile.load``; each problem is (the key's path, what is
wrong), which the loader turns into ``file:line: key: what``.
"""

from __future__ import annotations

from gpuops.sim.fleet.config import GPU_MODELS, sharing_problem
from gpuops.sim.fleet.fleetfile.fits import job_class_problems, reservation_problems
from gpuops.sim.fleet.fleetfile.positions import Path_
from gpuops.sim.fleet.fleetfile.schema import _FleetFile, _Pool


def _duplicates(names: list[str], key: str) -> list[tuple[Path_, str]]:
    seen: dict[str, int] = {}
    out: list[tuple[Path_, str]] = []
    for i, name in enumerate(names):
        if name in seen:
            out.append(((key, i, "name"), f"{name!r} is also {key}[{seen[name]}]"))
        seen.setdefault(name, i)
    return out


def cross_check(doc: _FleetFile) -> list[tuple[Path_, str]]:
    """Problems between sections: unknown names, quotas beyond a pool, jobs that never fit."""
    out: list[tuple[Path_, str]] = []
    models = ", ".join(GPU_MODELS)
    pools = {p.name: p for p in doc.pools}
    out += _duplicates([p.name for p in doc.pools], "pools")
    out += _duplicates([p.name for p in doc.projects], "projects")
    out += _duplicates([c.name for c in doc.priority_classes], "priority_classes")
    out += _duplicates([c.name for c in doc.job_classes], "job_classes")
    for i, pool in enumerate(doc.pools):
        if pool.model not in GPU_MODELS:
            out.append((("pools", i, "model"), f"{pool.model!r} is unknown; use one of {models}"))
        if pool.sharing is not None:
            problem = sharing_problem(pool.sharing.mode, pool.sharing.slices, pool.model)
            if problem:
                key = "slices" if "slices" in problem.split(" ")[0] else "mode"
                out.append((("pools", i, "sharing", key), problem))
        host = pool.host
        if host is not None and host.peak_watts is not None and host.peak_watts < host.idle_watts:
            out.append(
                (
                    ("pools", i, "host", "peak_watts"),
                    f"{host.peak_watts:g} is below idle_watts {host.idle_watts:g}",
                )
            )
        if pool.max_nodes is not None and pool.max_nodes < pool.nodes:
            out.append(
                (
                    ("pools", i, "max_nodes"),
                    f"max_nodes {pool.max_nodes} is below the {pool.nodes} nodes the pool "
                    "starts with",
                )
            )
    for i, project in enumerate(doc.projects):
        for pool_name, gpus in project.reserved.items():
            where: Path_ = ("projects", i, "reserved", pool_name)
            if pool_name not in pools:
                out.append((where, f"no pool {pool_name!r}; pools: {', '.join(pools)}"))
            elif gpus < 0:
                out.append((where, f"reserved GPUs must be >= 0, got {gpus}"))
    out += reservation_problems(doc)
    for i, pc in enumerate(doc.priority_classes):
        for j, model in enumerate(pc.models):
            if model not in GPU_MODELS:
                out.append(
                    (("priority_classes", i, "models", j), f"{model!r} is unknown; use {models}")
                )
    projects = {p.name for p in doc.projects}
    classes = {c.name for c in doc.priority_classes}
    for i, jc in enumerate(doc.job_classes):
        if projects and jc.project not in projects:
            out.append((("job_classes", i, "project"), f"no project {jc.project!r}"))
        if jc.priority_class not in classes:
            known = ", ".join(sorted(classes)) or "none declared"
            out.append(
                (
                    ("job_classes", i, "priority_class"),
                    f"{jc.priority_class!r} is not one of {known}",
                )
            )
    out += job_class_problems(doc)
    out += _initial_job_problems(doc, pools, classes)
    return out


def _initial_job_problems(
    doc: _FleetFile, pools: dict[str, _Pool], classes: set[str]
) -> list[tuple[Path_, str]]:
    """Initial jobs name pools, nodes (node-0, node-1, ... across pools in order) and classes
    that exist, and fit the node they are pinned to."""
    out: list[tuple[Path_, str]] = []
    node_pool: dict[str, _Pool] = {}
    for pool in doc.pools:
        for _ in range(pool.nodes):
            node_pool[f"node-{len(node_pool)}"] = pool
    used: dict[str, int] = {}
    for i, job in enumerate(doc.initial_jobs or []):
        if job.pool and job.pool not in pools:
            out.append((("initial_jobs", i, "pool"), f"no pool {job.pool!r}"))
        if job.priority_class and job.priority_class not in classes:
            out.append((("initial_jobs", i, "priority_class"), f"no class {job.priority_class!r}"))
        if job.node is None:
            continue
        home = node_pool.get(job.node)
        if home is None:
            last = f"node-{len(node_pool) - 1}" if node_pool else "none"
            out.append((("initial_jobs", i, "node"), f"no node {job.node!r} (node-0 .. {last})"))
            continue
        used[job.node] = used.get(job.node, 0) + job.gpus
        if used[job.node] > home.gpus_per_node:
            out.append(
                (
                    ("initial_jobs", i, "gpus"),
                    f"{job.node} has {home.gpus_per_node} GPUs; initial jobs ask for "
                    f"{used[job.node]} there",
                )
            )
    return out
