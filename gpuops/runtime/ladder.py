"""The remediation ladder: heals the nodes gpuops quarantined for a faulty GPU in pools whose
profile is ``full``, and gives them back only after a health check passed.

The gate tells it of every outcome (``outcome``): a ``migrate`` that a ``GpuFault`` alert of
profile ``full`` triggered and that succeeded puts the node on the ladder (``quarantined``),
unless its outcome says the node was drained or cordoned by someone else before.
Each node then climbs in a worker thread of its own (``_climb``): the pure state machine
(``gpuops.model.health.ladder``) says what is due — reset the GPU, reboot the node, the health
check, the return, or telling a human — and each move runs through the one gate
(``Gate.run_step``: the kill switch, pause, a veto, dry-run and a lost leadership hold it, its
intent is audited before it runs). A reboot that does not wait for the node's work (the node
agent's, on Kubernetes) is preceded by a ``migrate`` of the whole node through the executor
that quarantined it (``_empty``): pods it leaves on the node hold the reboot (``_hold``), and a
node whose cordon someone else lifted leaves the ladder there, never drained nor rebooted
(``_leave``). The node's record is stored after every move, so a
restarted engine or a new leader goes on from where it was; a move's decision id comes from
the node, the fault's episode and the step, so a move interrupted by a crash runs again under
the same id and its executor does it once. Every ``interval`` (``tick``) the nodes a hold left
are looked at again.

Built by ``gpuops.runtime.facade.Engine``; read by the API (``GET /api/v1/health/nodes``) and
cleared by an admin (``clear``).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuops.model.decisions import (
    ActionSpec,
    Decision,
    Evidence,
    Outcome,
    OutcomeStatus,
    Target,
    Transition,
    Verdict,
    decision_id,
)
from gpuops.model.health.catalogue import Remedy
from gpuops.model.health.events import FAULT_LABELS
from gpuops.model.health.ladder import (
    ACTIVE,
    REPAIRING,
    LadderRules,
    Move,
    Quarantine,
    Repair,
    Stage,
    after,
    clear,
    due,
    left,
    quarantined,
    start,
    steps_for,
    unproven,
)
from gpuops.model.health.pacing import (
    POLICY,
    Domain,
    Pace,
    deferred,
    domains_of,
    failed,
    outages,
    over_bound,
    proved,
)
from gpuops.runtime.gate import Gate
from gpuops.runtime.health import FAULT_TRIGGER
from gpuops.runtime.outages import OutagesUnknown, OutOfService
from gpuops.settings import LadderSettings
from gpuops.store.interface import RepairRepository

log = logging.getLogger(__name__)

FULL = "full"
"""The profile whose quarantines climb the ladder."""
QUARANTINES = ACTIVE | {Stage.NEEDS_HUMAN}
"""The stages of a node out of service because gpuops quarantined it: not counted against
another's repair (``pacing.max_fraction``)."""
GROUP = "health-ladder"
"""The group the ladder's decisions are recorded under."""


DEFERRED = "deferred: "
"""How the reason of a node waiting for its domain's pace begins."""
HELD = "reboot held: "
"""How the reason of a node whose reboot waits for pods still on it begins."""
SCHEDULER_REBOOTS = frozenset({"scheduler", "slurm", "fleet"})
"""Executors whose ``reboot`` waits for the node's work to end (Slurm's ``scontrol reboot``)
or models it (the simulated fleet). Any other (the node agent, a command) reboots at once: the
executor that quarantined the node drains it first."""


def pace_of(settings: LadderSettings) -> Pace:
    p = settings.pacing
    return Pace(
        dwell_s=p.dwell, cooldown_s=p.cooldown, max_cooldown_s=p.max_cooldown, jitter=p.jitter
    )


def domains_of_repair(repair: Repair, names: list[str]) -> tuple[str, ...]:
    """The failure domains of ``repair``'s node (``pool=a100``, ``rack=r12``), by ``names``."""
    return domains_of(names, {**repair.labels, "pool": repair.pool, POLICY: repair.policy})


def rules_of(settings: LadderSettings) -> LadderRules:
    return LadderRules(
        steps=tuple(Move(s) for s in settings.steps),
        max_remediations=settings.max_remediations,
        window_s=settings.window,
    )


class RepairLadder:
    """Every node's climb; thread-safe."""

    def __init__(
        self,
        *,
        settings: LadderSettings,
        store: RepairRepository,
        gate: Gate,
        clock: Callable[[], float],
        stopped: Callable[[], str | None],
        returned: Callable[[str, float], None],
        registry: CollectorRegistry,
        workers: int = 8,
        draw: Callable[[], float] = random.random,
        out_of_service: OutOfService | None = None,
    ) -> None:
        """``stopped``: why no move may start now (the kill switch, pause), or None;
        ``returned``: told of a node given back to service (the health inbox: a fault that
        began before never acts); ``draw``: a number in [0, 1) for a cooldown's jitter;
        ``out_of_service``: the nodes out of service (``pacing.max_fraction``), or None."""
        self.settings = settings
        self.rules = rules_of(settings)
        self.pace = pace_of(settings)
        self._draw = draw
        if settings.pacing.max_fraction is not None and out_of_service is None:
            raise ValueError(
                "health.ladder.pacing.max_fraction needs what tells the nodes out of service"
                " (pacing.unavailable)"
            )
        self._out = out_of_service
        self._pacing = threading.Lock()
        """One node at a time decides whether its domain lets its repair start."""
        self._store = store
        self._gate = gate
        self._clock = clock
        self._stopped = stopped
        self._returned = returned
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ladder")
        self.moves = Counter(
            "gpuops_health_ladder_moves",
            "Moves of the remediation ladder (reset_gpu, reboot, validate, return, hand_over) by "
            "result (ok, failed, held; left: someone else took the node back).",
            ["move", "result"],
            registry=registry,
        )
        self.nodes = Gauge(
            "gpuops_health_ladder_nodes",
            "Nodes on the remediation ladder by stage (quarantined, remediating, validating, "
            "returned, needs_human).",
            ["stage"],
            registry=registry,
        )
        self.width = Gauge(
            "gpuops_health_ladder_width",
            "Paced repair: the repairs a failure domain (pool=a100, rack=r12) may have unproven"
            " at once.",
            ["domain"],
            registry=registry,
        )
        self.deferrals = Counter(
            "gpuops_health_ladder_deferrals",
            "Paced repair: nodes whose repair waited, by the failure domain that held it: its "
            "width was taken, it cooled down after a failed repair, or its nodes out of "
            "service were at its bound (or not known).",
            ["domain"],
            registry=registry,
        )
        hours = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
        self.return_seconds = Histogram(
            "gpuops_health_time_to_return_seconds",
            "From a node's quarantine reaching the remediation ladder to its return to service.",
            buckets=(*hours, 172800.0, 604800.0),
            registry=registry,
        )
        self.attempts = Histogram(
            "gpuops_health_ladder_attempts",
            "Remediation steps (reset_gpu, reboot) a node's climb took, by how it ended "
            "(returned, needs_human).",
            ["end"],
            buckets=(0, 1, 2, 3, 4, 6, 8),
            registry=registry,
        )
        self.between_seconds = Histogram(
            "gpuops_health_time_between_incidents_seconds",
            "Per node: from the start of one fault that put it on the remediation ladder to "
            "the start of its next.",
            buckets=(3600.0, 21600.0, 86400.0, 259200.0, 604800.0, 2592000.0, 7776000.0),
            registry=registry,
        )
        self._count()
        for name, data in self._store.domains().items():
            self.width.labels(name).set(Domain.from_dict(json.loads(data)).width)

    # --- records -----------------------------------------------------------------------------
    def repair(self, node: str) -> Repair | None:
        data = self._store.repair(node)
        return None if data is None else Repair.from_dict(json.loads(data))

    def repairs(self) -> list[Repair]:
        """Every node's record; one that cannot be read is skipped (logged), so that it holds
        no other node back (``gpuops state check`` names it)."""
        found = []
        for node, data in self._store.repairs().items():
            try:
                found.append(Repair.from_dict(json.loads(data)))
            except (ValueError, TypeError, KeyError) as exc:
                log.error("remediation ladder: the record of %s cannot be read: %s", node, exc)
        return found

    def _save(self, repair: Repair) -> None:
        data = json.dumps(repair.as_dict())
        self._store.save_repair(repair.node, repair.stage.value, data, self._clock())
        self._count()

    def domain(self, name: str) -> Domain:
        data = self._store.domains().get(name)
        return Domain(name) if data is None else Domain.from_dict(json.loads(data))

    def _save_domain(self, domain: Domain) -> None:
        self._store.save_domain(domain.name, json.dumps(domain.as_dict()))
        self.width.labels(domain.name).set(domain.width)

    def domains(self, repair: Repair) -> tuple[str, ...]:
        """The failure domains ``repair``'s node belongs to (``pacing.domains``)."""
        return domains_of_repair(repair, self.settings.pacing.domains)

    def _failed(self, repair: Repair, why: str) -> None:
        """A repair failed: in each of its domains the width drops to 1, a cooldown begins."""
        for name in self.domains(repair):
            with self._pacing:
                domain = failed(self.domain(name), self.pace, self._clock(), self._draw())
                self._save_domain(domain)
            log.warning(
                "paced repair in %s: the repair of %s failed (%s): width 1, next repair in %.0f s",
                domain.name,
                repair.node,
                why,
                max(0.0, domain.cooldown_until - self._clock()),
            )

    def _count(self) -> None:
        stages = [r.stage for r in self.repairs()]
        for stage in Stage:
            if stage is not Stage.HEALTHY:
                self.nodes.labels(stage.value).set(stages.count(stage))

    # --- what starts a climb -----------------------------------------------------------------
    def outcome(self, decision: Decision, outcome: Outcome) -> None:
        """The gate's outcome hook: a successful quarantine of a faulty GPU's node in a pool
        whose profile is ``full`` puts the node on the ladder."""
        action = decision.action
        if not outcome.ok or action is None or action.type != "migrate":
            return
        if decision.evidence.expr != FAULT_TRIGGER or decision.transition is not Transition.FIRE:
            return
        labels = decision.target.labels
        node = labels.get("node")
        if labels.get("profile") != FULL or not node:
            return
        if outcome.changed.get("drained") is False:
            log.info("node %s was drained by someone else: not on the remediation ladder", node)
            return
        if outcome.changed.get("cordoned") is False:  # Kubernetes: the cordon is not gpuops'
            why = outcome.changed.get("why") or "not cordoned"
            log.info("node %s: %s: not on the remediation ladder", node, why)
            return
        remedy = labels.get("remedy", "")
        q = Quarantine(
            node=node,
            gpu=labels.get("uuid", ""),
            remedy=Remedy(remedy) if remedy in Remedy.__members__.values() else Remedy.RESET_GPU,
            reason=labels.get("reason", ""),
            policy=decision.policy,
            executor=action.executor,
            decision_id=decision.id,
            episode=decision.episode_start,
            pool=labels.get("pool", ""),
            labels={k: v for k, v in labels.items() if k not in FAULT_LABELS},
        )
        if self.quarantined(q):
            self.kick(node)

    def quarantined(self, q: Quarantine) -> bool:
        """Put ``q``'s node on the ladder; False (logged) when it changes nothing."""
        with self._lock:
            before = self.repair(q.node)
            repair, note = quarantined(before, q, self._clock())
            if note:
                log.info("node %s quarantined for %s: %s", q.node, q.reason, note)
                return False
            self._save(repair)
        if before is not None and before.episode and q.episode > before.episode:
            self.between_seconds.observe(q.episode - before.episode)
        if before is not None and before.stage is Stage.RETURNED and not before.proven:
            self._failed(before, f"faulty again within {self.pace.dwell_s:g} s of its return")
        log.warning(
            "node %s quarantined for GPU %s (%s): on the remediation ladder",
            q.node,
            q.gpu or "?",
            q.reason,
        )
        return True

    # --- the climbs --------------------------------------------------------------------------
    def tick(self) -> None:
        """Prove the repairs that stayed healthy for the dwell, then look again at every node
        with something due (a hold may have let go, a domain may have room), the longest
        waiting first."""
        self._prove()
        for repair in sorted(self.repairs(), key=lambda r: (r.since, r.node)):
            if repair.stage in ACTIVE or due(repair) is not None:
                self.kick(repair.node)

    def _prove(self) -> None:
        now = self._clock()
        for repair in self.repairs():
            if repair.stage is not Stage.RETURNED or repair.proven:
                continue
            if repair.returned_at is None or now < repair.returned_at + self.pace.dwell_s:
                continue
            with self._lock:
                current = self.repair(repair.node)
                if current != repair:
                    continue  # it moved meanwhile (faulty again)
                self._save(replace(repair, proven=True))
            for name in self.domains(repair):
                with self._pacing:
                    domain = proved(self.domain(name))
                    self._save_domain(domain)
                log.info(
                    "paced repair in %s: the repair of %s held for %g s: width %d",
                    domain.name,
                    repair.node,
                    self.pace.dwell_s,
                    domain.width,
                )

    def kick(self, node: str) -> None:
        """Climb ``node``'s ladder in a worker, unless one is at it already."""
        with self._lock:
            if node in self._busy or self._closed:
                return
            self._busy.add(node)
        self._pool.submit(self._climb_safely, node)

    def _climb_safely(self, node: str) -> None:
        try:
            self._climb(node)
        except Exception:  # the next tick tries again; the record says where it stopped
            log.exception("remediation ladder of %s stopped by an error", node)
        finally:
            with self._lock:
                self._busy.discard(node)

    def _climb(self, node: str) -> None:
        while True:
            repair = self.repair(node)
            if repair is None or self._closed:
                return
            if repair.stage is Stage.QUARANTINED:
                if self._stopped() is not None or not self._start(repair):
                    return
                continue
            move = due(repair)
            if move is None:
                return
            stopped = self._stopped()
            if stopped is not None and move is not Move.HAND_OVER:
                log.info("node %s: %s waits: %s", node, move.value, stopped)
                return
            ran = self._run(repair, move)
            if ran is None:
                self.moves.labels(move.value, "held").inc()
                return  # held at the gate: the next tick tries again, under the same id
            if isinstance(ran, str):
                self.moves.labels(move.value, "left").inc()
                self._leave(repair, move, ran)
                return
            ok, note = ran
            self.moves.labels(move.value, "ok" if ok else "failed").inc()
            now = self._clock()
            moved = after(repair, move, ok, note, self.rules, now)
            self._save(moved)
            if moved.stage is Stage.NEEDS_HUMAN and repair.stage in REPAIRING:
                self._failed(moved, moved.why)
            if move is Move.RETURN and ok:
                self._returned(node, now)
                if repair.quarantined_at is not None:
                    self.return_seconds.observe(max(0.0, now - repair.quarantined_at))
            if moved.stage in (Stage.RETURNED, Stage.NEEDS_HUMAN) and repair.stage in ACTIVE:
                tried = sum(1 for d in moved.done if d in (Move.RESET_GPU, Move.REBOOT))
                self.attempts.labels(moved.stage.value).observe(tried)
            self._said(moved, move, ok, note)

    def _bounds(self, repair: Repair, names: tuple[str, ...]) -> tuple[str, str] | None:
        """The first of ``names`` (``repair``'s domains) whose nodes out of service, but for
        the nodes gpuops quarantined, are past its bound, or cannot be told now, and why;
        None: none holds the repair (or no ``max_fraction``)."""
        fraction = self.settings.pacing.max_fraction
        bounded = [n for n in names if not n.startswith(f"{POLICY}=")]
        if fraction is None or self._out is None or not bounded:
            return None
        try:
            nodes = self._out.nodes()
        except OutagesUnknown as exc:
            return bounded[0], (
                f"paced repair in {bounded[0]}: its nodes out of service are not known"
                f" ({exc}): it waits for a fresh answer"
            )
        labels = [n.split("=", 1)[0] for n in bounded]
        ours = {r.node for r in self.repairs() if r.stage in QUARANTINES}
        found = outages(labels, nodes, repair.node, ours)
        for name in bounded:
            outage = found.get(name)
            if outage is None:
                return name, (
                    f"paced repair in {name}: its nodes out of service are not known (no node"
                    f" of {name} in the answer of health.ladder.pacing.unavailable): it waits"
                    " for a fresh answer"
                )
            why = over_bound(name, outage, fraction)
            if why is not None:
                return name, why
        return None

    def _deferred(self, repair: Repair, names: tuple[str, ...]) -> tuple[str, str] | None:
        """The first of ``names`` whose width or cooldown holds ``repair``, and why (call
        with ``_pacing`` held)."""
        others = [r for r in self.repairs() if r.node != repair.node and unproven(r)]
        busy_in = [set(self.domains(r)) for r in others]
        for name in names:
            busy = sum(1 for domains in busy_in if name in domains)
            why = deferred(self.domain(name), busy, self.pace, self._clock())
            if why is not None:
                return name, why
        return None

    def _start(self, repair: Repair) -> bool:
        """Start ``repair`` if every domain of its node lets it (False: it waits, the
        deferral in its reason, naming the domain that holds it)."""
        names = self.domains(repair)
        bound = self._bounds(repair, names)  # a query: before the lock
        with self._pacing:
            held = self._deferred(repair, names) or bound
            if held is not None:
                name, why = held
                if not repair.why.startswith(DEFERRED):  # a new wait: counted and audited once
                    self.deferrals.labels(name).inc()
                    log.info("node %s waits: %s", repair.node, why)
                    steps = steps_for(repair.remedy, self.rules)
                    first = steps[0] if steps else Move.HAND_OVER
                    waits = self._decision(repair, first)
                    key, paced = waits.target.key, "ladder:paced"
                    self._gate.record(
                        waits.but(
                            id=decision_id(repair.policy, key, repair.episode, paced),
                            verdict=Verdict.SUPPRESSED_PACED,
                            reason=why,
                        )
                    )
                if repair.why != DEFERRED + why:
                    self._save(replace(repair, why=DEFERRED + why))
                return False
            started = start(repair, self.rules, self._clock())
            self._save(started)
        self._said(started)
        return True

    def _run(self, repair: Repair, move: Move) -> tuple[bool, str] | str | None:
        """Run ``move`` through the gate: (ok, what its outcome said), None when held, or why
        the node leaves the ladder (a person took it back)."""
        decision = self._decision(repair, move)
        if decision.action is None:  # a hand-over without a webhook: audited, nothing run
            self._gate.record(decision)
            return True, ""
        if move is Move.REBOOT and decision.action.executor not in (
            *SCHEDULER_REBOOTS,
            repair.executor,
        ):
            emptied = self._empty(repair, decision)
            if not isinstance(emptied, tuple) or not emptied[0]:
                return emptied
        outcome = self._gate.run_step(decision, once=move is Move.VALIDATE)
        if outcome.status is OutcomeStatus.SKIPPED:
            log.debug("node %s: %s held: %s", repair.node, move.value, outcome.error)
            return None
        if outcome.ok:
            if move is Move.RETURN and False in (
                outcome.changed.get("uncordoned"),
                outcome.changed.get("resumed"),
            ):
                log.warning(
                    "node %s: its return leaves it as someone else left it: %s",
                    repair.node,
                    outcome.changed.get("why") or "not gpuops' cordon or drain",
                )
            return True, _said(outcome.changed)
        return False, outcome.error or "failed"

    def _empty(self, repair: Repair, reboot: Decision) -> tuple[bool, str] | str | None:
        """Before a reboot that does not wait for the node's work (Kubernetes: the node
        agent's), the quarantine's executor drains the whole node: the quarantine evicted
        only the faulty GPU's pods. (True, ""): empty; None: held by pods still on the node
        (a disruption budget, a pod left to complete, a vetoed pod or one in a system
        namespace: the next tick tries again); (False, why): the drain failed, or its executor
        says it did not empty the node (``emptied: false``: nothing is rebooted on a guess);
        a string: the node is no longer gpuops' (someone else lifted its cordon): it leaves
        the ladder."""
        node = {k: v for k, v in reboot.target.labels.items() if k != "uuid"}
        drain = reboot.but(
            id=decision_id(
                repair.policy, reboot.target.key, repair.episode, "ladder:drain", len(repair.done)
            ),
            target=Target(key=reboot.target.key, labels=node),
            action=ActionSpec("migrate", repair.executor),
            reason=f"remediation ladder: drain of {repair.node} before its reboot"
            f" ({repair.reason})",
        )
        outcome = self._gate.run_step(drain)
        if outcome.status is OutcomeStatus.SKIPPED:
            return None
        if not outcome.ok:
            return False, f"the drain before the reboot failed: {outcome.error or 'failed'}"
        changed = outcome.changed
        if changed.get("cordoned") is False:
            return str(changed.get("why") or "its cordon is not gpuops' any more")
        kept = [str(p) for p in changed.get("kept") or []]
        held = [str(p) for p in changed.get("held") or []]
        stopping = [  # evicted now, or terminating within their grace period
            *(f"{p} (evicted)" for p in [*changed.get("evicted", ()), *changed.get("deleted", ())]),
            *(str(p) for p in changed.get("stopping") or []),
        ]
        if kept or held or stopping:
            pods = [*kept, *held, *stopping]
            since = repair.held_since if repair.why.startswith(HELD) else None
            limit = self.settings.reboot_hold
            if since is not None and self._clock() - since >= limit:
                return False, (
                    f"its reboot was held {limit:g} s (health.ladder.reboot_hold) by "
                    f"{len(pods)} pod(s) still on the node: {_shown(pods)}"
                )
            self._hold(repair, reboot, kept, held, stopping)
            return None
        if changed.get("emptied") is False:  # the drain failed: what runs there is not known
            why = changed.get("why") or "its drain did not run to its end"
            return False, f"the drain before the reboot did not empty the node: {why}"
        return True, ""

    def _hold(
        self,
        repair: Repair,
        reboot: Decision,
        kept: list[str],
        held: list[str],
        stopping: list[str],
    ) -> None:
        """The reboot waits for pods still on the node — ``kept`` on purpose (a veto, a system
        namespace), ``held`` by a disruption budget, ``stopping`` within their grace period:
        said in the record, and the first time in the log and, for ``kept``, the audit."""
        pods = [*kept, *held, *stopping]
        why = f"{HELD}{len(pods)} pod(s) still on the node that it would stop: {_shown(pods)}"
        if not repair.why.startswith(HELD):  # a new hold: logged and audited once
            log.log(
                logging.WARNING if kept or held else logging.INFO,
                "node %s: its reboot waits: %s",
                repair.node,
                why[len(HELD) :],
            )
            if kept:
                key = reboot.target.key
                self._gate.record(
                    reboot.but(
                        id=decision_id(
                            repair.policy, key, repair.episode, "ladder:held", len(repair.done)
                        ),
                        verdict=Verdict.SUPPRESSED_VETO,
                        reason=f"remediation ladder: reboot of {repair.node} held: {_shown(kept)}",
                    )
                )
        if repair.why != why:
            since = repair.held_since if repair.why.startswith(HELD) else self._clock()
            self._save(replace(repair, why=why, held_since=since))

    def _leave(self, repair: Repair, move: Move, why: str) -> None:
        """Someone else took ``repair``'s node back during its repair: it leaves the ladder,
        neither drained again nor rebooted; said in its record, the log and the audit."""
        now = self._clock()
        gone = left(repair, why, now)
        self._save(gone)
        self._returned(repair.node, now)
        reason = (
            f"node {repair.node} leaves the remediation ladder before its {move.value}: {why};"
            " gpuops neither drains nor reboots it"
        )
        log.warning("%s (its fault: %s)", reason, repair.reason)
        self._gate.record(
            self._decision(repair, move).but(
                id=decision_id(repair.policy, f"node={repair.node}", repair.episode, "ladder:left"),
                action=None,
                transition=Transition.CLEAR,
                reason=reason,
            )
        )

    def _decision(self, repair: Repair, move: Move) -> Decision:
        now = self._clock()
        key = f"node={repair.node}"
        labels = {**repair.labels, "node": repair.node}
        if repair.gpu:
            labels["uuid"] = repair.gpu
        if repair.pool:
            labels["pool"] = repair.pool
        if move is Move.HAND_OVER:
            reason = f"node {repair.node} needs a human: {repair.why}"
        else:
            reason = f"remediation ladder: {move.value} of {repair.node} ({repair.reason})"
        return Decision(
            id=decision_id(
                repair.policy, key, repair.episode, f"ladder:{move.value}", len(repair.done)
            ),
            policy=repair.policy,
            group=GROUP,
            target=Target(key=key, labels=labels),
            transition=Transition.CLEAR if move is Move.RETURN else Transition.FIRE,
            action=self._action(repair, move),
            evidence=Evidence(
                expr=f"health ladder: {move.value}",
                value=None,
                pending_since=repair.episode,
                observed_at=now,
            ),
            at=now,
            episode_start=repair.episode,
            repeat=len(repair.done),
            reason=reason,
        )

    def _action(self, repair: Repair, move: Move) -> ActionSpec | None:
        s = self.settings
        if move is Move.RESET_GPU:
            executor = s.reset_gpu.executor or "nvml-agent"
            return ActionSpec("reset_gpu", executor, s.reset_gpu.params)
        if move is Move.REBOOT:
            return ActionSpec("reboot", s.reboot.executor or "scheduler", s.reboot.params)
        if move is Move.VALIDATE:
            params = {"argv": list(s.validation.command), "timeout_s": s.validation.timeout}
            return ActionSpec("validate", s.validation.executor, params)
        if move is Move.RETURN:
            return ActionSpec("resume", repair.executor)
        if s.webhook is None:
            return None
        return ActionSpec("needs_human", s.webhook.executor or "webhook", s.webhook.params)

    def _said(
        self, repair: Repair, move: Move | None = None, ok: bool = True, note: str = ""
    ) -> None:
        node, what = repair.node, f"{move.value} {'done' if ok else 'failed'}" if move else ""
        if repair.stage is Stage.NEEDS_HUMAN and move is not Move.HAND_OVER:
            log.warning(
                "node %s NEEDS A HUMAN: %s; it stays drained and is not remediated again until"
                " an admin clears it (gpuops health clear %s)",
                node,
                repair.why,
                node,
            )
        elif repair.stage is Stage.RETURNED:
            log.warning("node %s returned to service after %s", node, ", ".join(repair.done))
        elif repair.stage is Stage.REMEDIATING:
            log.warning("node %s: %s; next: %s", node, what or "remediation begins", repair.step)
        elif move is not None and move is not Move.HAND_OVER:
            log.info("node %s: %s%s", node, what, f": {note}" if note else "")

    # --- what an admin asks ------------------------------------------------------------------
    def clear(self, node: str, by: str) -> Repair:
        """An admin clears a node that needed a human: it may climb again at its next fault
        (it stays drained: the admin returns it). ``ValueError`` when it needs none."""
        with self._lock:
            repair = self.repair(node)
            if repair is None:
                raise ValueError(f"node {node} is not on the remediation ladder")
            cleared = clear(repair, by, self._clock())
            self._save(cleared)
        self._gate.record(
            Decision(
                id=decision_id(repair.policy, f"node={node}", repair.episode, "ladder:clear"),
                policy=repair.policy,
                group=GROUP,
                target=Target(key=f"node={node}", labels={"node": node}),
                transition=Transition.CLEAR,
                action=None,
                evidence=Evidence("health ladder: clear", None, None, self._clock()),
                at=self._clock(),
                episode_start=repair.episode,
                reason=f"node {node} cleared by {by} (it needed a human: {repair.why})",
            )
        )
        log.warning("node %s cleared by %s: it may be remediated again", node, by)
        return cleared

    def stop(self) -> None:
        """Start no move; wait for the running ones."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no node is climbing (tests)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._busy:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _shown(pods: list[str]) -> str:
    return "; ".join(pods[:5]) + ("; ..." if len(pods) > 5 else "")


def _said(changed: Any) -> str:
    if isinstance(changed, Mapping):
        return ", ".join(f"{k}={v}" for k, v in changed.items() if v not in (None, "", []))[:256]
    return ""
