"""A batch operation rolled over the simulated cluster in virtual time: a driver upgrade or a
reboot taking nodes out of service a few at a time, as ``gpuops batch run`` would
(docs/batch.md), so a what-if shows the capacity it costs.

Each node goes quarantine (drained: its jobs move to free GPUs elsewhere or go back to the
queue, as ``migrate`` does) → step → reboot (the node boots: no job runs on it) → validate →
return (back in service), each phase lasting the operation's ``timing``; its driver version is
the new one from the end of its step. Waves: the canary first, then ``max_parallel`` nodes, a
wave starting when the one before it has returned and only as many nodes as leave at most
``budget`` nodes of the counted ones out of service — every node out counts, drained, failed
or booting, whoever made it so. A node out of service before its wave stays so after it; a
node gone (powered down) or failed when its wave comes is skipped.

Built from an operation file by ``gpuops.sim.whatif.batch``; stepped by
``gpuops.sim.fleet.virtual.VirtualFleet`` after each cluster step; its ``RolloutReport``
is printed by the what-if's report.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.model import Node
from gpuops.sim.fleet.operations import migrate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutSpec:
    """What to roll, when, and how long each phase of a node takes (virtual seconds)."""

    name: str
    targets: tuple[str, ...]
    """The nodes, in the order their waves take them."""
    at_s: float = 0.0
    """When the rollout starts (virtual seconds since the run's start)."""
    canary: int = 1
    max_parallel: int = 1
    budget: int = 1
    """Nodes of ``counted`` out of service at any time, at most."""
    counted: str | None = None
    """The pool whose nodes count against ``budget`` (None: every node)."""
    drain: bool = True
    """False (``quarantine: none``): the node stays in service during its step; its jobs
    are requeued only when it reboots."""
    quarantine_s: float = 60.0
    step_s: float = 600.0
    reboot_s: float = 0.0
    validate_s: float = 0.0
    return_s: float = 10.0
    driver_version: str | None = None
    """The version the nodes report after their step (None: unchanged)."""

    @property
    def node_s(self) -> float:
        """One node's whole procedure."""
        return self.quarantine_s + self.step_s + self.reboot_s + self.validate_s + self.return_s


@dataclass
class _InProgress:
    started: float
    was_out: bool
    gpus: int
    out_since: float | None
    """Since when the rollout holds it out of service (None: not yet, or never)."""
    upgraded: bool = False
    rebooting: bool = False


@dataclass
class RolloutReport:
    """What the rollout cost, as it ran."""

    name: str
    at_s: float
    targets: int
    budget: int
    done: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    waves: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    """(start, nodes) of each wave."""
    ended_s: float | None = None
    """When its last node returned (None: not finished when the run ended)."""
    until_s: float = 0.0
    """The virtual time the report is as of (its last step)."""
    gpu_s_out: float = 0.0
    """GPU-seconds its nodes were out of service so far (nodes out before it not counted)."""
    requeued: int = 0
    """Jobs its drains sent back to the queue (they wait for GPUs again)."""
    moved: int = 0
    """Jobs its drains moved to free GPUs of other nodes (each restarts)."""
    most_out: int = 0
    """The most nodes of those counted out of service at once while it ran."""
    waited_s: float = 0.0
    """Virtual seconds a wave waited for room under the budget."""
    driver_version: str | None = None
    upgraded: int = 0
    fleet_gpus: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "at_s": self.at_s,
            "targets": self.targets,
            "done": list(self.done),
            "skipped": dict(self.skipped),
            "waves": [{"at_s": at, "nodes": list(nodes)} for at, nodes in self.waves],
            "ended_s": self.ended_s,
            "duration_s": None if self.ended_s is None else self.ended_s - self.at_s,
            "gpu_hours_out": self.gpu_s_out / 3600.0,
            "requeued": self.requeued,
            "moved": self.moved,
            "most_out": self.most_out,
            "budget": self.budget,
            "waited_s": self.waited_s,
            "driver_version": self.driver_version,
            "upgraded": self.upgraded,
        }

    def lines(self) -> list[str]:
        """The rollout in words."""
        start = _duration(self.at_s)
        head = (
            f"rollout {self.name} from +{start}: {self.targets} nodes,"
            f" {len(self.done)} done in {len(self.waves)} waves"
        )
        if self.ended_s is None:
            left = self.targets - len(self.done) - len(self.skipped)
            head += f"; not finished when the run ended ({left} left)"
        else:
            head += f", ended at +{_duration(self.ended_s)} ({_duration(self.ended_s - self.at_s)})"
        out = [head]
        hours = self.gpu_s_out / 3600.0
        span = (self.ended_s if self.ended_s is not None else self.until_s) - self.at_s
        share = ""
        if span > 0 and self.fleet_gpus:
            share = f" ({100.0 * self.gpu_s_out / (span * self.fleet_gpus):.1f}% of the fleet's"
            share += " GPU-hours while it ran)"
        out.append(f"  GPU-hours out of service: {hours:.1f}{share}")
        out.append(
            f"  jobs its drains requeued: {self.requeued} (they waited for GPUs again);"
            f" moved to other nodes: {self.moved} (each restarted)"
        )
        out.append(
            f"  most nodes out of service at once: {self.most_out} (budget {self.budget});"
            f" waves waited {_duration(self.waited_s)} for room"
        )
        if self.driver_version:
            out.append(f"  driver {self.driver_version} on {self.upgraded} nodes")
        out += [f"  skipped {node}: {why}" for node, why in sorted(self.skipped.items())]
        return out


def _duration(seconds: float) -> str:
    seconds = max(0.0, round(seconds))
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


def _count(listed: object) -> int:
    return len(listed) if isinstance(listed, list) else 0


def _out(node: Node) -> bool:
    return node.failed or node.drained or node.booting_until is not None


class Rollout:
    """The rollout's progress; ``step`` after each cluster step moves it on."""

    def __init__(self, spec: RolloutSpec, cluster: Cluster) -> None:
        self.spec = spec
        self._queue = list(spec.targets)
        self._running: dict[str, _InProgress] = {}
        self._waiting_since: float | None = None
        self._waited = 0.0
        self._closed_gpu_s = 0.0
        """GPU-seconds out of service of the nodes that finished."""
        gpus = sum(p.nodes * p.gpus_per_node for p in cluster.config.pools)
        self.report = RolloutReport(
            spec.name,
            spec.at_s,
            len(spec.targets),
            spec.budget,
            driver_version=spec.driver_version,
            fleet_gpus=gpus,
        )

    def step(self, cluster: Cluster) -> None:
        """Move the rollout to the cluster's time: phases that ended, then the next wave."""
        now = cluster.time
        if now < self.spec.at_s or self.report.ended_s is not None:
            return
        with cluster.lock:
            for name in list(self._running):
                self._advance(cluster, name, now)
            if not self._running and self._queue:
                self._start_wave(cluster, now)
            self.report.most_out = max(self.report.most_out, self._out_now(cluster))
            self.report.gpu_s_out = self._closed_gpu_s + sum(
                (now - held.out_since) * held.gpus
                for held in self._running.values()
                if held.out_since is not None
            )
            self.report.until_s = now
            if not self._running and not self._queue:
                self.report.ended_s = now
                log.info("rollout %s ended at %.0f s", self.spec.name, now)

    def _out_now(self, cluster: Cluster) -> int:
        """Nodes of those counted out of service now, whoever took them out."""
        pool = self.spec.counted
        return sum(_out(n) for n in cluster.nodes.values() if pool is None or n.pool == pool)

    def _start_wave(self, cluster: Cluster, now: float) -> None:
        spec = self.spec
        canary = not self.report.waves and spec.canary > 0  # canary: 0 means none
        size = min(spec.canary, spec.max_parallel) if canary else spec.max_parallel
        room = spec.budget - self._out_now(cluster)
        chosen: list[str] = []
        for name in list(self._queue):
            if len(chosen) == size:
                break
            node = cluster.nodes.get(name)
            if node is None or node.failed:
                self.report.skipped[name] = "powered down" if node is None else "failed"
                self._queue.remove(name)
                continue
            if not _out(node):  # a node out already takes no more room
                if room <= 0:
                    continue
                room -= 1
            chosen.append(name)
            self._queue.remove(name)
        if not chosen:
            if self._queue:
                if self._waiting_since is None:
                    self._waiting_since = now
                self.report.waited_s = self._waited + now - self._waiting_since
            return
        if self._waiting_since is not None:
            self._waited += now - self._waiting_since
            self.report.waited_s = self._waited
            self._waiting_since = None
        self.report.waves.append((now, tuple(chosen)))
        for name in chosen:
            node = cluster.nodes[name]
            was_out = _out(node)
            held = spec.drain and not was_out
            self._running[name] = _InProgress(now, was_out, len(node.gpus), now if held else None)
            if held:
                self._drain(cluster, name)
        log.info("rollout %s: wave %d: %s", spec.name, len(self.report.waves) - 1, chosen)

    def _drain(self, cluster: Cluster, name: str) -> None:
        with cluster.causes.acting(f"batch/{self.spec.name}"):  # the what-if names who stopped
            changed = migrate(cluster, name)
        self.report.moved += _count(changed.get("moved"))
        self.report.requeued += _count(changed.get("requeued"))

    def _advance(self, cluster: Cluster, name: str, now: float) -> None:
        spec, node_state = self.spec, self._running[name]
        node = cluster.nodes.get(name)
        elapsed = now - node_state.started
        stepped = spec.quarantine_s + spec.step_s
        if node is None:  # powered down meanwhile: nothing more to do on it
            self.report.skipped[name] = "powered down during its procedure"
            self._finish(name, now)
            return
        if elapsed >= stepped and not node_state.upgraded:
            node_state.upgraded = True
            if spec.driver_version is not None:
                node.driver_version = spec.driver_version
                self.report.upgraded += 1
        if spec.reboot_s > 0 and elapsed >= stepped and not node_state.rebooting:
            node_state.rebooting = True
            if not spec.drain and not node_state.was_out:
                self._drain(cluster, name)  # its jobs stop with the machine
                node_state.out_since = now
            node.booting_until = node_state.started + stepped + spec.reboot_s
        if elapsed >= spec.node_s:
            if not node_state.was_out:
                node.drained = False
                cluster.schedule()
            self.report.done.append(name)
            self._finish(name, now)

    def _finish(self, name: str, now: float) -> None:
        node_state = self._running.pop(name)
        if node_state.out_since is not None:
            self._closed_gpu_s += (now - node_state.out_since) * node_state.gpus
