"""The actions the fleet offers: reclaim, clocks, scale out/in, migrate, fail/restore, the
remediation ladder's steps (GPU reset, reboot, health check), and the scenario injections
(profile change, burst).

Called by the control API (``gpuops.sim.fleet.control``) and by in-process users through
``FleetSim``. Each takes the cluster lock, applies one change and returns what changed as a
JSON-ready dict (empty when there was nothing to do, so a retry is a no-op success). Topology
changes notify the cluster's owner after the lock is released.
"""

from __future__ import annotations

import logging

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import GIB, PROFILES, JobSpec
from gpuops.sim.fleet.errors import BadRequest, Conflict
from gpuops.sim.fleet.health import REBOOT_S, RESET_S, VALIDATE_S
from gpuops.sim.fleet.model import CULLED_PROFILES, Node
from gpuops.sim.fleet.sharing import fits

log = logging.getLogger(__name__)

MAX_NODES_PER_CALL = 64
MAX_BURST = 10_000

Changed = dict[str, object]


def reclaim(cluster: Cluster, uuid: str) -> Changed:
    """Take GPU ``uuid`` back from the job holding it whole: the job is requeued (at the back
    of its priority, its submit time kept, so its completion time counts the wait) with its
    restart cost on its remaining time (``Cluster.restart_cost``); all of its GPUs become
    free. A job that runs until reclaimed (no duration) ends; a notebook session is culled
    (``Cluster.cull``: it ends, not requeued to hold a GPU again). A free or shared GPU: no-op.

    The scheduler runs at once: when nothing else waits, the job may start straight again
    (on the same GPUs or others). Then nothing was reclaimed — it holds GPUs as before, and
    only its restart was paid — so ``reclaimed_gpu_s`` counts its remaining GPU-seconds only
    when it did not start again, and ``released_gpus`` lists only the GPUs it no longer
    holds (``restarted_on``: those it holds again)."""
    with cluster.lock:
        node, gpu = cluster.find_gpu(uuid)
        if gpu.job is None:
            return {}
        job = cluster.job(gpu.job)
        held_s = job.remaining_s if job.remaining_s is not None else 0.0
        cluster.counters["reclaimed"] += 1
        if job.duration_s is None:
            cluster.causes.stopped("culled", job.priority_class)  # it ends
            freed = cluster.release(job)
            requeued = False
        elif job.profile in CULLED_PROFILES:
            freed = cluster.cull(job)
            requeued = False
        else:
            cluster.restart_cost(job)
            freed = list(job.gpu_uuids)
            cluster.requeue(job)
            job.front = False
            job.queued_at = cluster.time
            requeued = True
        cluster.schedule()
        again = list(job.gpu_uuids) if requeued and job.state == "running" else []
        if not again:
            cluster.reclaimed_gpu_s += max(held_s, 0.0) * job.gpus
        released = [u for u in freed if u not in again]
        log.info(
            "reclaimed %s (%s) from %s: freed %s, started again on %s",
            job.id, job.project, node.name, freed, again,
        )  # fmt: skip
        return {
            "uuid": uuid,
            "node": node.name,
            "job": job.id,
            "project": job.project,
            "released_gpus": released,
            "requeued": requeued,
            "restarted_on": again,
        }


def pack(cluster: Cluster, uuid: str) -> Changed:
    """Put the shareable job holding GPU ``uuid`` whole onto slices of shared GPUs: onto
    GPUs shared already in one of its pools (stopped and restarted there: its restart cost is
    charged, ``Cluster.restart_cost``), else its own GPUs become shared in place (it keeps
    running; their free slices take the next shareable jobs). A job moved less than
    ``scheduler.move_interval`` ago is only shared in place (no ping-pong with
    ``consolidate``). Its own GPUs are not shared when no job its size would fit beside it
    (shared, they would take nobody, and the job would never move on): it is left whole, with
    ``left_whole`` saying why, for a later pack; so is a job on a GPU of a pool that cannot
    share while no shared GPU of its other pools has a slice for it (``Slices.shares_elsewhere``:
    one of them would take it at all; else 409). Already on slices: no-op."""
    with cluster.lock:
        node, gpu = cluster.find_gpu(uuid)
        job_id = gpu.job or (gpu.tenants[0] if gpu.tenants else None)
        if job_id is None:
            return {}
        job = cluster.job(job_id)
        if job.shared:
            return {}
        if not job.shareable:
            raise Conflict(f"job {job.id} on GPU {uuid} is not shareable (its job class says)")
        scheduler = cluster.scheduler
        move = scheduler.pack_target(job, node)
        if move is not None:
            kind, (to_node, gpus) = move
            charged = cluster.restart_cost(job)
            cluster.requeue(job)
            cluster.queues[job.pool].remove(job.id)
            job.borrowed = kind == "borrowed"
            cluster.start_shared(job, to_node, gpus)
            cluster.counters["packed"] += 1
            cluster.schedule()
            log.info("packed %s from %s onto shared GPUs of %s", job.id, node.name, to_node.name)
            return {
                "uuid": uuid,
                "job": job.id,
                "from": node.name,
                "to": to_node.name,
                "gpus": [g.uuid for g in gpus],
                "restart_gpu_s": round(charged, 1),
            }
        spec = cluster.pools[node.pool]
        sharing = spec.sharing
        if sharing is None and scheduler.slices.shares_elsewhere(job):
            # a light job on a GPU of a pool that cannot share (a fallback pool: an analysis
            # job on a rented H100) moves once a shared GPU of its pools has a slice for it
            log.info("pack %s: left whole on %s (no slice free yet)", job.id, node.name)
            return _left_whole(
                uuid, job.id, node.name,
                f"pool {node.pool} cannot share (no sharing in the fleet file)",
            )  # fmt: skip
        if sharing is None:
            raise Conflict(
                f"no shared GPU with a free slice takes job {job.id}, and pool {node.pool} of "
                f"GPU {uuid} cannot share (no sharing in the fleet file)"
            )
        in_place = scheduler.admits_on_slices(job, node.pool)
        if in_place is None:
            raise Conflict(
                f"job {job.id} of project {job.project} on GPU {uuid} runs on GPUs of pool "
                f"{node.pool} that its quota does not cover (borrowed or reserved for others), "
                "and the fleet does not lend slices (scheduler.slice_borrowing); left whole"
            )
        mine = [g for g in node.gpus if g.job == job.id]
        too_big = [g.uuid for g in mine if not scheduler.slices.fits_a_slice(job, node.pool, g)]
        if too_big:
            need = cluster.job_bytes(job, mine[0]) / GIB
            raise Conflict(
                f"job {job.id} needs {need:.1f} GiB per GPU: it does not fit one {sharing} slice "
                f"of GPUs {too_big} in pool {node.pool} ({spec.slices} slices); left whole"
            )
        alone = [
            g.uuid
            for g in mine
            if not fits(
                sharing, [cluster.job_bytes(job, g)], cluster.job_bytes(job, g),
                g.model.memory_bytes, spec.slices,
            )
        ]  # fmt: skip
        if alone:
            # shared in place, its GPU would take nobody (no job its size fits beside it) and
            # the job would never move on: ``pack`` acts only on GPUs held whole. Left whole, a
            # later pack (the policy repeats) moves it once a slice of its pools has room.
            need = cluster.job_bytes(job, mine[0]) / GIB
            log.info("pack %s: left whole on %s (nothing its size fits beside it)", job.id, alone)
            return _left_whole(
                uuid, job.id, node.name,
                f"sharing its own GPUs {alone} would take nobody: two jobs of {need:.1f} GiB "
                f"do not fit one {mine[0].model.memory_bytes / GIB:.0f} GiB "
                f"{mine[0].model.short}",
            )  # fmt: skip
        for g in mine:
            g.job = None
        cluster.causes.made_shared(g.uuid for g in mine)
        job.borrowed = in_place == "borrowed"
        started = job.started_at
        cluster.start_shared(job, node, mine)
        job.started_at = started  # it goes on running: no restart
        cluster.counters["packed"] += 1
        cluster.schedule()
        log.info("packed %s in place: %s shared", job.id, [g.uuid for g in mine])
        return {
            "uuid": uuid,
            "job": job.id,
            "from": node.name,
            "to": node.name,
            "gpus": [g.uuid for g in mine],
            "restart_gpu_s": 0.0,
        }


def _left_whole(uuid: str, job: str, node: str, why: str) -> Changed:
    """``pack``'s answer for a job it leaves on its whole GPU, for a later pack."""
    return {
        "uuid": uuid,
        "job": job,
        "from": node,
        "to": None,
        "gpus": [],
        "restart_gpu_s": 0.0,
        "left_whole": f"no shared GPU of its pools has a slice for it, and {why}",
    }


def lock_clocks(cluster: Cluster, uuid: str, max_clock_mhz: int) -> Changed:
    """Cap GPU ``uuid``'s graphics/SM clock at ``max_clock_mhz`` (within its supported range)."""
    with cluster.lock:
        node, gpu = cluster.find_gpu(uuid)
        low, high = gpu.model.min_clock_mhz, gpu.model.max_clock_mhz
        if not low <= max_clock_mhz <= high:
            raise BadRequest(
                f"max_clock_mhz {max_clock_mhz} is outside the supported range {low}-{high} MHz "
                f"of {gpu.model.name}"
            )
        previous = gpu.clock_locked_mhz
        if previous == max_clock_mhz:
            return {}
        gpu.clock_locked_mhz = max_clock_mhz
        cluster.counters["downclocked"] += 1
        holders = ([gpu.job] if gpu.job is not None else []) + gpu.tenants
        for job_id in holders:
            cluster.causes.touched(cluster.jobs[job_id].priority_class, slowed=True)
        return {
            "uuid": uuid,
            "node": node.name,
            "max_clock_mhz": max_clock_mhz,
            "previous": previous,
        }


def reset_clocks(cluster: Cluster, uuid: str) -> Changed:
    """Remove the clock lock of GPU ``uuid``; no-op when it has none."""
    with cluster.lock:
        node, gpu = cluster.find_gpu(uuid)
        previous = gpu.clock_locked_mhz
        if previous is None:
            return {}
        gpu.clock_locked_mhz = None
        cluster.counters["restored"] += 1
        return {"uuid": uuid, "node": node.name, "max_clock_mhz": None, "previous": previous}


def _node_count(nodes: int) -> int:
    if not 1 <= nodes <= MAX_NODES_PER_CALL:
        raise BadRequest(f"nodes must be within [1, {MAX_NODES_PER_CALL}], got {nodes}")
    return nodes


def scale_out(cluster: Cluster, pool: str, nodes: int) -> Changed:
    """Add ``nodes`` nodes to ``pool`` (at most up to its ``max_nodes``: a physical pool's
    machines powered up again); queued jobs are placed on them at once."""
    with cluster.lock:
        spec = cluster.pool(pool)
        wanted = _node_count(nodes)
        if spec.max_nodes is not None:
            present = sum(1 for n in cluster.nodes.values() if n.pool == pool)
            wanted = min(wanted, spec.max_nodes - present)
            if wanted <= 0:
                raise Conflict(
                    f"pool {pool} has its {spec.max_nodes} nodes (max_nodes) already; "
                    "nothing to add"
                )
        added = [cluster.add_node(pool, boot=True).name for _ in range(wanted)]
        cluster.counters["nodes_added"] += len(added)
        cluster.schedule()
    log.info("pool %s scaled out by %s", pool, added)
    cluster.notify_topology()
    return {"pool": pool, "added": added}


def scale_in(cluster: Cluster, pool: str, nodes: int, node: str | None = None) -> Changed:
    """Remove up to ``nodes`` idle nodes (no job on them) of ``pool``, newest first — or just
    ``node``, when named and idle (powering down the node a policy found idle); nodes of an
    active quota grant stay (``release_quota`` removes them)."""
    with cluster.lock:
        cluster.pool(pool)
        if node is not None and cluster.node(node).pool != pool:
            raise BadRequest(f"node {node} is in pool {cluster.node(node).pool}, not {pool}")
        granted = {name for g in cluster.scheduler.grants.values() for name in g.nodes}
        idle = [
            n
            for n in cluster.nodes.values()
            if n.pool == pool
            and n.idle()
            and n.name not in granted
            and (node is None or n.name == node)
        ]
        idle.sort(key=lambda n: (n.state == "up", -n.seq))
        removed = [n.name for n in idle[: _node_count(nodes)]]
        for name in removed:
            cluster.power_down(name)
    if not removed:
        return {}
    log.info("pool %s scaled in: removed %s", pool, removed)
    cluster.notify_topology()
    return {"pool": pool, "removed": removed}


def migrate(cluster: Cluster, node_name: str) -> Changed:
    """Drain ``node_name`` and move its jobs to free GPUs on other up nodes, else to the queue:
    each job stopped restarts, paying ``Cluster.restart_cost`` (its work since its last
    checkpoint and the relaunch), as a drained Slurm job is requeued and a pod evicted.
    ``drained`` says whether this call drained it (False: it was drained already, by whoever:
    not ours to give back)."""
    with cluster.lock:
        node = cluster.node(node_name)
        job_ids = sorted(node.job_ids())
        already = node.drained
        if already and not job_ids:
            return {"node": node_name, "drained": False, "state": node.state}
        node.drained = True
        moved: list[dict[str, object]] = []
        requeued: list[str] = []
        restart_gpu_s = 0.0
        for job_id in job_ids:
            job = cluster.job(job_id)
            restart_gpu_s += cluster.restart_cost(job)
            cluster.requeue(job)
            cluster.schedule()
            if job.state == "running":
                moved.append({"job": job.id, "from": node.name, "to": job.node})
            else:
                requeued.append(job.id)
        cluster.counters["migrated"] += len(moved)  # a job requeued waits: not migrated
        cluster.counters["requeued_by_migrate"] += len(requeued)
        state = node.state
    log.info("migrated off %s: moved %s, requeued %s", node_name, moved, requeued)
    cluster.notify_topology()
    return {
        "node": node_name,
        "drained": not already,
        "state": state,
        "moved": moved,
        "requeued": requeued,
        "restart_gpu_s": round(restart_gpu_s, 1),
    }


def resume(cluster: Cluster, node_name: str) -> Changed:
    """Give the drained ``node_name`` back to the scheduler (``migrate``'s undo); a failed
    node stays failed (``restore`` brings it back). Nothing when it is not drained."""
    with cluster.lock:
        node = cluster.node(node_name)
        if not node.drained:
            return {}
        node.drained = False
        cluster.schedule()
        state = node.state
    log.info("node %s resumed (%s)", node_name, state)
    cluster.notify_topology()
    return {"node": node_name, "state": state}


def consolidate(cluster: Cluster, node_name: str) -> Changed:
    """Empty the partly used node ``node_name`` and power it down, as Kubernetes' cluster
    autoscaler scales down an underused node whose pods fit elsewhere (or Karpenter's
    consolidation, or Slurm's ``POWER_DOWN_ASAP`` after a requeue): every job on it moves to
    free GPUs (slices, for a job on slices) of other up nodes of its pool or of another of its
    class's pools that admits it, best fit (``Scheduler.drain_plan``; moved to another pool, it
    borrows nothing there), each paying its restart (``Cluster.restart_cost``: work since
    its last checkpoint, none for a session, plus the fleet's ``restart``) and not moved
    again within ``scheduler.move_interval``; then the node is drained and removed (powered
    down: ``scale_out`` powers a machine of the pool up again). All or nothing: Conflict,
    with the reason, when any job cannot move."""
    with cluster.lock:
        node = cluster.node(node_name)
        moves = cluster.scheduler.drain_plan(node)
        node.drained = True  # no placement lands here meanwhile
        moved: list[dict[str, object]] = []
        restart_gpu_s = 0.0
        for move in moves:
            job = move.job
            restart_gpu_s += cluster.restart_cost(job)
            cluster.requeue(job)
            cluster.queues[job.pool].remove(job.id)
            job.borrowed = move.borrowed
            if move.shared:
                cluster.start_shared(job, move.node, move.gpus)
            else:
                cluster.start(job, move.node, move.gpus)
            moved.append(
                {"job": job.id, "to": move.node.name, "pool": move.node.pool, "gpus": job.gpu_uuids}
            )
        if not node.idle():  # cannot happen: every job moved above; never power down a job
            raise Conflict(f"node {node_name} still runs {sorted(node.job_ids())}")
        cluster.power_down(node_name)
        cluster.counters["consolidated"] += 1
        cluster.counters["moved"] += len(moves)
        cluster.schedule()
    log.info("consolidated %s (pool %s): moved %s", node_name, node.pool, moved)
    cluster.notify_topology()
    return {
        "node": node_name,
        "pool": node.pool,
        "moved": moved,
        "restart_gpu_s": round(restart_gpu_s, 1),
        "powered_down": True,
    }


def fail(cluster: Cluster, node_name: str) -> Changed:
    """Fail ``node_name``: its listener closes (Prometheus sees up == 0), its jobs stall."""
    with cluster.lock:
        node = cluster.node(node_name)
        if node.failed:
            return {}
        node.failed = True
    log.info("node %s failed", node_name)
    cluster.notify_topology()
    return {"node": node_name, "state": "failed"}


def restore(cluster: Cluster, node_name: str) -> Changed:
    """Bring ``node_name`` back up (clears failed and drained); its listener re-opens."""
    with cluster.lock:
        node = cluster.node(node_name)
        if not node.failed and not node.drained:
            return {}
        previous = node.state
        node.failed = False
        node.drained = False
        cluster.schedule()
    log.info("node %s restored (was %s)", node_name, previous)
    cluster.notify_topology()
    return {"node": node_name, "state": "up", "previous": previous}


def _out_for(cluster: Cluster, node: Node, seconds: float) -> float:
    """Keep ``node`` out of service ``seconds`` more (a repair step running on it); returns
    until when."""
    until = max(node.booting_until or cluster.time, cluster.time) + seconds
    node.booting_until = until
    return until


def _drained_for(node: Node, step: str) -> None:
    if not node.drained:
        raise Conflict(f"node {node.name} is not drained: drain it before {step}")


def reset_gpu(cluster: Cluster, uuid: str) -> Changed:
    """Reset GPU ``uuid`` of a drained node (``nvidia-smi --gpu-reset``: nothing may run on
    it): ``Cluster.health`` says whether the node is healthy after; the node stays out for
    ``RESET_S``."""
    with cluster.lock:
        node, gpu = cluster.find_gpu(uuid)
        _drained_for(node, "a GPU reset")
        if gpu.job is not None or gpu.tenants:
            raise Conflict(f"GPU {uuid} on {node.name} runs jobs: no reset")
        healthy = cluster.health.reset_gpu(node.name, uuid, cluster.time)
        until = _out_for(cluster, node, RESET_S)
    log.info("GPU %s on %s reset (healthy after: %s)", uuid, node.name, healthy)
    return {"node": node.name, "uuid": uuid, "reset": True, "until": round(until, 1)}


def reboot(cluster: Cluster, node_name: str) -> Changed:
    """Reboot the drained ``node_name``, which stays drained (``scontrol reboot`` with the
    drain kept): out of service for ``REBOOT_S``."""
    with cluster.lock:
        node = cluster.node(node_name)
        _drained_for(node, "a reboot")
        if not node.idle():
            raise Conflict(f"node {node_name} runs {sorted(node.job_ids())}: no reboot")
        healthy = cluster.health.reboot(node_name, cluster.time)
        until = _out_for(cluster, node, REBOOT_S)
    log.info("node %s rebooted (healthy after: %s)", node_name, healthy)
    return {"node": node_name, "rebooted": True, "until": round(until, 1)}


def validate(cluster: Cluster, node_name: str) -> Changed:
    """The health check of the drained ``node_name`` (``VALIDATE_S``): Conflict, naming what
    failed, when ``Cluster.health`` finds it unhealthy."""
    with cluster.lock:
        node = cluster.node(node_name)
        _drained_for(node, "a health check")
        passed, why = cluster.health.validate(node_name)
        _out_for(cluster, node, VALIDATE_S)
    if not passed:
        raise Conflict(f"node {node_name} failed its health check: {why}")
    return {"node": node_name, "passed": True}


def set_profile(cluster: Cluster, job_id: str, profile: str) -> Changed:
    """Change the utilization profile of a queued or running job."""
    if profile not in PROFILES:
        raise BadRequest(f"profile {profile!r} is unknown; use one of {list(PROFILES)}")
    with cluster.lock:
        job = cluster.job(job_id)
        previous = job.profile
        if previous == profile:
            return {}
        job.profile = profile
        return {"job": job_id, "profile": profile, "previous": previous}


def grant_quota(
    cluster: Cluster, project: str, grant: str, pool: str, gpus: int, duration_s: float | None
) -> Changed:
    """Raise ``project``'s quota in ``pool`` by ``gpus`` (adding the nodes that hold them) until
    released or ``duration_s`` passes. The same ``grant`` id again: no-op."""
    with cluster.lock:
        _owned(cluster, project, grant)
        known = grant in cluster.scheduler.grants
        g = cluster.scheduler.grant(grant, project, pool, gpus, duration_s)
        cluster.schedule()
    if known:
        return {}
    cluster.notify_topology()
    return {"grant": g.to_json(), "quota": cluster.scheduler.quota(project, pool)}


def release_quota(cluster: Cluster, project: str, grant: str) -> Changed:
    """End grant ``grant`` of ``project``: its quota goes and exactly its nodes are removed,
    whatever project's jobs landed there (requeued with compensation). Ended before: no-op."""
    with cluster.lock:
        active = cluster.scheduler.grants.get(grant)
        if active is not None and active.project != project:
            raise Conflict(
                f"grant {grant!r} belongs to project {active.project!r}, not {project!r}"
            )
        ended = cluster.scheduler.release(grant)
        cluster.schedule()
    if ended is None:
        return {}
    cluster.notify_topology()
    return ended.to_json()


def _owned(cluster: Cluster, project: str, grant: str) -> None:
    active = cluster.scheduler.grants.get(grant)
    if active is not None and active.project != project:
        raise Conflict(f"grant {grant!r} belongs to project {active.project!r}, not {project!r}")


def hold_class(cluster: Cluster, priority_class: str) -> Changed:
    """Keep queued jobs of ``priority_class`` from starting (running ones go on)."""
    with cluster.lock:
        if not cluster.scheduler.hold(priority_class):
            return {}
        cluster.causes.touched(priority_class)
        return {"priority_class": priority_class, "held": True}


def release_class(cluster: Cluster, priority_class: str) -> Changed:
    """Let queued jobs of ``priority_class`` start again."""
    with cluster.lock:
        if not cluster.scheduler.unhold(priority_class):
            return {}
        cluster.schedule()
        return {"priority_class": priority_class, "held": False}


def lend(cluster: Cluster, pool: str) -> Changed:
    """Lend the idle reserved GPUs of ``pool`` to other projects' waiting jobs (elastic
    quota); their owner takes them back by preemption, with compensation."""
    with cluster.lock:
        if not cluster.scheduler.lend(pool):
            return {}
        cluster.causes.lending(pool)
        cluster.schedule()
        return {"pool": pool, "lending": True}


def unlend(cluster: Cluster, pool: str) -> Changed:
    """Stop lending ``pool``'s reserved GPUs; borrowed jobs running there go on."""
    with cluster.lock:
        if not cluster.scheduler.unlend(pool):
            return {}
        return {"pool": pool, "lending": False}


def burst(cluster: Cluster, pool: str, count: int, gpus: int, duration_s: float | None) -> Changed:
    """Submit ``count`` training jobs of ``gpus`` GPUs to ``pool`` at once."""
    if not 1 <= count <= MAX_BURST:
        raise BadRequest(f"count must be within [1, {MAX_BURST}], got {count}")
    with cluster.lock:
        cluster.pool(pool)
        spec = JobSpec("training", gpus, "burst", pool, duration_s=duration_s)
        jobs = [cluster.submit(spec) for _ in range(count)]
        return {
            "pool": pool,
            "jobs": [j.id for j in jobs],
            "placed": sum(j.state == "running" for j in jobs),
            "queued": sum(j.state == "queued" for j in jobs),
        }
