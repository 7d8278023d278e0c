"""The fleet as an operator sees it, derived purely from Prometheus' answers and the engine's
holds: each node's state and health, its GPUs' health, utilization and the job holding them,
what gpuops holds on each, and the queue. No I/O: ``gpuops.api.routes.fleet`` asks the
``QUERIES`` and reads the holds from the store, then calls ``fleet``.

The series are those the policies read (docs/reference/metrics.md): the scrape of each GPU
node (``up{job="gpu-nodes"}``), the NVML exporter's ``nvml_*`` (or the simulated fleet's),
the Slurm exporter's node states, ``gpuops_gpu_allocated`` and ``gpuops_queue_pending_jobs``.
A series with no sample newer than the engine's freshness bound is stale: its node or GPU is
shown as "no data", never as healthy, and its old values are not shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuops.api.responses.fleet import (
    FleetOut,
    GpuOut,
    Health,
    HoldOut,
    NodeOut,
    NodeState,
    QueueOut,
)
from gpuops.model.decisions import Decision, Outcome, Sample
from gpuops.model.telling import effect

NODES = 'up{job="gpu-nodes"}'
LOOKBACK = "1h:15s"
"""How far back a node or GPU that stopped reporting is still listed (as "no data since"),
and the resolution of that look back: its last sample is found by a step of 15 s."""

QUERIES: Mapping[str, str] = {
    "up": NODES,
    "up_seen": f"timestamp({NODES}) or max_over_time(timestamp({NODES})[{LOOKBACK}])",
    "slurm_state": "gpuops_slurm_node_state == 1",
    "booting": "gpuops_node_booting == 1",
    "powered_down": "gpuops_node_powered_down == 1",
    "gpu_up": "nvml_gpu_up",
    "gpu_seen": f"timestamp(nvml_gpu_up) or max_over_time(timestamp(nvml_gpu_up)[{LOOKBACK}])",
    "utilization": "nvml_gpu_utilization_ratio",
    "temperature": "nvml_gpu_temperature_celsius",
    "xid": "sum by (node, uuid) (increase(nvml_gpu_xid_errors_total[1h])) > 0",
    "ecc": 'sum by (node, uuid) (increase(nvml_gpu_ecc_errors_total{error="uncorrected",'
    'counter="volatile"}[1h])) > 0',
    "remap_failed": "nvml_gpu_remapped_rows_failed == 1",
    "allocated": "gpuops_gpu_allocated == 1",
    "queue": "sum by (pool, reason) (gpuops_queue_pending_jobs)",
}
"""What the Fleet page asks Prometheus, by name (each an instant query at the same time)."""

SLURM_STATES: Mapping[str, NodeState] = {
    "idle": "up",
    "mixed": "up",
    "allocated": "up",
    "completing": "up",
    "draining": "draining",
    "drained": "drained",
    "down": "down",
    "powered_down": "powered_down",
    "powering_down": "powered_down",
    "powering_up": "booting",
}
"""Slurm's node states (``gpuops_slurm_node_state``) as the page names them."""

HOLD_WORDS: Mapping[str, str] = {  # a quarantine-* policy's migrate: "quarantined"
    "migrate": "drained",
    "consolidate": "emptied",
    "downclock": "downclocked",
    "reclaim": "reclaimed",
    "pack": "packed",
    "scale_out": "scaled out",
    "scale_in": "scaled in",
    "hold_class": "class held",
    "lend": "lending",
    "grant_quota": "quota granted",
    "notify": "notified",
}
"""What a verb leaves standing while its episode goes on, in words."""

DRAINING_VERBS = frozenset({"migrate", "consolidate"})
"""Verbs whose hold takes a node out of the scheduler (the node is shown drained when no
Slurm state says otherwise)."""


QUIET_STATES: frozenset[NodeState] = frozenset({"powered_down", "booting"})
"""States in which a node's exporter is not expected to answer."""


@dataclass(frozen=True)
class Held:
    """A hold and the labels of its target (which node or GPU it belongs to)."""

    labels: Mapping[str, str]
    hold: HoldOut


def hold_of(
    fire: Decision,
    dry_run: bool,
    undo: str | None,
    undo_decision_id: str | None,
    outcome: Outcome | None = None,
) -> HoldOut:
    """The hold a policy's fire that ran (``outcome``) leaves while its episode goes on."""
    verb = fire.action.type if fire.action is not None else "none"
    what = HOLD_WORDS.get(verb, verb.replace("_", " "))
    if verb in DRAINING_VERBS and fire.policy.startswith("quarantine"):
        what = "quarantined"  # rules/health: drained until its remediation or a human
    return HoldOut(
        what=what,
        policy=fire.policy,
        action=verb,
        decision_id=fire.id,
        at=fire.at,
        dry_run=dry_run,
        undo=undo,
        undo_decision_id=undo_decision_id,
        target=fire.target.key,
        effect="" if outcome is None else effect(verb, outcome.changed).text,
    )


@dataclass(frozen=True)
class Readings:
    """Prometheus' answers to ``QUERIES`` by name (a failed one is in ``errors`` and absent)."""

    at: float
    max_sample_age_s: float
    samples: Mapping[str, Sequence[Sample]] = field(default_factory=dict)
    errors: Sequence[str] = ()

    _gpus: dict[str, dict[tuple[str, str], Sample]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """Each answer's samples by (node, uuid), made once when first asked (``gpu``)."""

    def of(self, name: str) -> Sequence[Sample]:
        return self.samples.get(name, ())

    def gpu(self, name: str, key: tuple[str, str]) -> Sample | None:
        """The sample of answer ``name`` about the GPU ``key`` (node, uuid)."""
        index = self._gpus.get(name)
        if index is None:
            index = self._gpus[name] = _by_gpu(self.of(name))
        return index.get(key)

    def fresh(self, seen: float | None) -> bool:
        return seen is not None and self.at - seen <= self.max_sample_age_s


def _by_node(samples: Iterable[Sample]) -> dict[str, Sample]:
    return {s.labels.get("node", ""): s for s in samples if s.labels.get("node")}


def _by_gpu(samples: Iterable[Sample]) -> dict[tuple[str, str], Sample]:
    return {
        (s.labels.get("node", ""), s.labels.get("uuid", "")): s
        for s in samples
        if s.labels.get("uuid")
    }


def node_state(
    slurm: str | None,
    up: float | None,
    fresh: bool,
    booting: bool,
    drained_by_gpuops: bool,
    powered_down: bool = False,
) -> tuple[NodeState, str]:
    """A node's state and the series it was read from: Slurm's when served, else the
    booting flag, the fleet's powered-down flag (unless a fresh scrape answers), the scrape's
    ``up`` (only a fresh one) and gpuops' own drain."""
    if slurm is not None:
        return SLURM_STATES.get(slurm, "unknown"), f"gpuops_slurm_node_state ({slurm})"
    if booting:
        return "booting", "gpuops_node_booting"
    if powered_down and not (fresh and up is not None):
        return "powered_down", "gpuops_node_powered_down"
    if up is None or not fresh:
        return "unknown", f"{NODES}: no fresh sample"
    if up == 0:
        return "down", f"{NODES} == 0"
    if drained_by_gpuops:
        return "drained", "gpuops holds it drained"
    return "up", f"{NODES} == 1"


def _gpu(key: tuple[str, str], r: Readings, seen: Sample | None, holds: list[HoldOut]) -> GpuOut:
    node, uuid = key
    last_seen = seen.value if seen is not None else None
    now_up = r.gpu("gpu_up", key)
    fresh = now_up is not None and r.fresh(last_seen)  # absent now: gone stale (a marker)
    ref = seen or now_up

    def value(name: str) -> float | None:
        found = r.gpu(name, key) if fresh else None
        return None if found is None else found.value

    up = value("gpu_up")
    problems: list[str] = []
    health: Health = "ok"
    if not fresh:
        health = "no_data"
        problems.append("no fresh NVML reading")
    elif up == 0:
        health = "failed"
        problems.append("does not answer NVML (lost)")
    else:
        if value("remap_failed") is not None:
            health = "failed"
            problems.append("a memory row remapping failed: replace the GPU")
        xid = value("xid")
        if xid is not None:
            health = "failed" if health == "failed" else "degraded"
            problems.append(f"{xid:.0f} XID errors in the last hour")
        ecc = value("ecc")
        if ecc is not None:
            health = "failed" if health == "failed" else "degraded"
            problems.append(f"{ecc:.0f} uncorrected ECC errors in the last hour")
    allocated = r.gpu("allocated", key)
    alloc_labels = allocated.labels if allocated is not None else {}
    return GpuOut(
        uuid=uuid,
        index=ref.labels.get("gpu", "") if ref is not None else "",
        up=None if up is None else up == 1,
        health=health,
        problems=problems,
        utilization=value("utilization"),
        temperature_c=value("temperature"),
        job=alloc_labels.get("job") or None,
        project=alloc_labels.get("project") or None,
        last_seen=last_seen,
        stale=not fresh,
        holds=holds,
    )


def fleet(r: Readings, held: Sequence[Held], pool: str | None) -> FleetOut:
    """The fleet page's answer: every node seen in the last hour (``pool`` only, when given),
    its GPUs and the holds on each, the queue."""
    up_seen = _by_node(r.of("up_seen"))
    up_now = _by_node(r.of("up"))
    slurm = {n: s.labels.get("state", "") for n, s in _by_node(r.of("slurm_state")).items()}
    booting = _by_node(r.of("booting"))
    powered_down = _by_node(r.of("powered_down"))
    gpu_seen = _by_gpu(r.of("gpu_seen"))
    allocated = _by_gpu(r.of("allocated"))
    pools: dict[str, str] = {}
    for answer in (r.of("up_seen"), r.of("booting"), r.of("powered_down"), r.of("gpu_seen")):
        for s in answer:
            if s.labels.get("node") and s.labels.get("pool"):
                pools.setdefault(s.labels["node"], s.labels["pool"])
    names = set(up_seen) | set(slurm) | set(booting) | set(powered_down)
    names |= {n for n, _ in gpu_seen if n}
    gpu_keys = set(gpu_seen) | {k for k in allocated if k[0] in names}

    on_gpu: dict[tuple[str, str], list[HoldOut]] = {}
    on_node: dict[str, list[HoldOut]] = {}
    other: list[HoldOut] = []
    gpus_by_uuid = {uuid: node for node, uuid in gpu_keys}
    for h in held:
        uuid, node = h.labels.get("uuid"), h.labels.get("node")
        if uuid and (node or gpus_by_uuid.get(uuid)):
            on_gpu.setdefault((node or gpus_by_uuid[uuid], uuid), []).append(h.hold)
        elif node:
            on_node.setdefault(node, []).append(h.hold)
        elif pool is None or h.labels.get("pool") in (None, pool):
            other.append(h.hold)
    gpu_keys |= set(on_gpu)
    names |= set(on_node) | {n for n, _ in on_gpu}

    keys_of: dict[str, list[tuple[str, str]]] = {}
    for key in gpu_keys:
        keys_of.setdefault(key[0], []).append(key)
    nodes: list[NodeOut] = []
    for name in sorted(names):
        node_pool = pools.get(name, "")
        if pool is not None and node_pool != pool:
            continue
        seen = up_seen.get(name)
        last_seen = seen.value if seen is not None else None
        now_up = up_now.get(name)
        fresh = now_up is not None and r.fresh(last_seen)  # absent now: gone stale (a marker)
        holds = on_node.get(name, [])
        drained = any(h.action in DRAINING_VERBS and not h.dry_run for h in holds)
        state, source = node_state(
            slurm.get(name),
            now_up.value if now_up is not None and fresh else None,
            fresh,
            name in booting,
            drained,
            name in powered_down,
        )
        gpus = sorted(
            (_gpu(k, r, gpu_seen.get(k), on_gpu.get(k, [])) for k in keys_of.get(name, ())),
            key=_by_index,
        )
        stated = name in slurm or source == "gpuops_node_powered_down"
        health, problems = _node_health(state, fresh, stated, gpus)
        nodes.append(
            NodeOut(
                name=name,
                pool=node_pool,
                state=state,
                state_source=source,
                health=health,
                problems=problems,
                last_seen=last_seen,
                stale=not fresh,
                gpus=gpus,
                holds=holds,
                attention=state != "up"
                or health != "ok"
                or bool(holds)
                or any(g.holds for g in gpus),
            )
        )
    queue = _queue(r.of("queue"))
    shown = [q for q in queue if pool is None or q.pool == pool]
    all_pools = sorted(set(pools.values()) | {q.pool for q in queue} - {""})
    return FleetOut(
        at=r.at,
        max_sample_age_s=r.max_sample_age_s,
        pool=pool,
        pools=all_pools,
        nodes=nodes,
        queue=shown,
        pending_jobs=sum(q.pending_jobs for q in shown) if "queue" in r.samples else None,
        other_holds=other,
        errors=list(r.errors),
    )


def _by_index(g: GpuOut) -> tuple[int, str]:
    """GPUs in NVML index order (``gpu`` 0, 1, ... 10), then by UUID."""
    return (int(g.index) if g.index.isdigit() else 1 << 30, g.uuid)


def _node_health(
    state: NodeState, fresh: bool, stated: bool, gpus: Sequence[GpuOut]
) -> tuple[Health, list[str]]:
    """``stated``: a series other than the node's scrape says its state (Slurm, the fleet's
    powered-down flag); a node in a quiet state is not faulted for GPUs that do not answer."""
    problems: list[str] = []
    if not fresh and not stated:
        return "no_data", ["its exporter has no fresh sample"]
    if state == "down":
        return "failed", ["down"]
    if not fresh and state not in QUIET_STATES:
        problems.append("its exporter has no fresh sample")
    bad = [g for g in gpus if g.health != "ok" and not (g.stale and state in QUIET_STATES)]
    for g in bad:
        problems.append(f"GPU {g.index or g.uuid}: {', '.join(g.problems)}")
    if any(g.health == "failed" for g in bad):
        return "failed", problems
    return ("degraded" if problems else "ok"), problems


def _queue(samples: Iterable[Sample]) -> list[QueueOut]:
    by_pool: dict[str, dict[str, float]] = {}
    for s in samples:
        reasons = by_pool.setdefault(s.labels.get("pool", ""), {})
        reason = s.labels.get("reason", "")
        reasons[reason] = reasons.get(reason, 0) + s.value
    return [
        QueueOut(
            pool=p,
            pending_jobs=_count(sum(reasons.values())),
            reasons={k or "(none)": _count(v) for k, v in sorted(reasons.items()) if v},
        )
        for p, reasons in sorted(by_pool.items())
    ]


def _count(value: float) -> int | float:
    return int(value) if value == int(value) else value
