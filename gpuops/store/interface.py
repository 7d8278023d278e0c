"""The state backend's interface: the frozen values it hands back and one repository Protocol per
aggregate (decisions, approvals, quota requests, Alertmanager episodes, controls, guardrail
windows, policy states), joined in ``Store`` — what ``gpuops.runtime`` needs of a backend.

``gpuops.store.sqlite.StateStore`` (SQLite, the embedded default) and
``gpuops.store.postgres.PostgresStore`` implement ``Store`` with the same queries
(``gpuops.store.sql``) and the same values. Nothing outside a backend sees a row or a ``dict``:
decisions come back as ``StoredDecision``, approvals as ``Approval``, quota requests as
``QuotaRequest``, received alerts as ``InboxItem``. ``gpuops.store.codecs`` turns each value
into its JSON form and back (a backend stores that form). The failures a backend raises are
``gpuops.store.errors``'.

Writes that belong to one commit take the handle that ``Store.transaction()`` yields (opaque to
callers: the backend's own connection or cursor); the others are one transaction each.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any, Protocol

from gpuops.model.alerts import Alert
from gpuops.model.decisions import Decision, Outcome, OutcomeStatus
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.guardrails import GuardrailState
from gpuops.model.health.events import HealthEvent

Transaction = Any
"""The handle of an open transaction (``Store.transaction()``); only its backend reads it."""


class DecisionStatus(StrEnum):
    """Where a stored decision stands: ``started`` — it runs (or ran, and the engine stopped
    before its outcome was stored); ``done`` — its outcome is stored, or it runs nothing."""

    STARTED = "started"
    DONE = "done"


class Audited(IntEnum):
    """How much of a stored decision the audit spool holds (write-ahead audit)."""

    NOTHING = 0
    INTENT = 1
    """The decision and its verdict: written before its action may run."""
    OUTCOME = 2
    """Its outcome too."""


@dataclass(frozen=True)
class StoredDecision:
    """A decision as the store holds it: the decision (its current verdict), where it stands,
    its outcome once it has one, and how much of it the audit spool holds."""

    decision: Decision
    status: DecisionStatus
    outcome: Outcome | None = None
    audited: Audited = Audited.NOTHING
    retried_at: float | None = None
    """When an admin's retry of this (failed) decision was accepted: at most once per id."""

    @property
    def id(self) -> str:
        return self.decision.id

    @property
    def failed(self) -> bool:
        return (
            self.status is DecisionStatus.DONE
            and self.outcome is not None
            and self.outcome.status is OutcomeStatus.FAILURE
        )


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Approval:
    """A decision of an ``approval: required`` policy waiting for (or settled by) an admin."""

    decision: Decision
    """The decision as it was recorded when it began to wait (verdict ``awaiting_approval``)."""
    requested_at: float
    expires_at: float
    status: ApprovalStatus = ApprovalStatus.PENDING
    decided_by: str | None = None
    decided_at: float | None = None

    @property
    def decision_id(self) -> str:
        return self.decision.id

    @property
    def policy(self) -> str:
        return self.decision.policy

    @property
    def target(self) -> str:
        return self.decision.target.key


class QuotaStatus(StrEnum):
    PENDING = "pending"
    APPLYING = "applying"
    ACTIVE = "active"
    DRY_RUN = "dry_run"
    """Approved while the engine runs in dry-run: recorded, nothing applied (so nothing is
    undone at its end, where it becomes ``ended``; never applied later)."""
    RELEASING = "releasing"
    ENDED = "ended"
    DENIED = "denied"
    EXPIRED = "expired"
    FAILED = "failed"


@dataclass(frozen=True)
class QuotaRequest:
    """An elastic quota request: "N more GPUs for project X for 8 hours"."""

    id: str
    project: str
    gpus: int
    duration_s: float
    reason: str
    requested_by: str
    requested_at: float
    expires_at: float
    """Until when an admin can approve it."""
    status: QuotaStatus = QuotaStatus.PENDING
    nodes: int = 0
    pool: str = "default"
    decided_by: str | None = None
    decided_at: float | None = None
    starts_at: float | None = None
    ends_at: float | None = None
    grant_decision: str | None = None
    undo_decision: str | None = None
    error: str | None = None
    release_attempts: int = 0
    """Tries of the undo that did not succeed (part of the next try's decision id)."""
    apply_attempts: int = 0
    """Tries of the grant that the gate held (kill switch, pause, budget): part of the next
    try's decision id, so the grant is decided again once the hold lifts."""
    retry_at: float | None = None
    """When a held grant is decided again at the earliest (the hold's reason is ``error``)."""


@dataclass(frozen=True)
class InboxItem:
    """One Alertmanager alert (webhook v4 ``alerts[]`` item) received and not handled yet."""

    id: int
    alert: Alert
    received_at: float


@dataclass(frozen=True)
class AlertKey:
    """What makes a notification of an alert the same one again: a retried webhook or a
    resend has the same fingerprint, ``startsAt`` and status."""

    fingerprint: str
    starts_at: str
    status: str


class PolicyStateRepository(Protocol):
    """Per-policy evaluation states, one row per target."""

    def policy_state(self, policy: str) -> PolicyState: ...
    def policy_names(self) -> list[str]: ...
    def save_policy_state(self, db: Transaction, policy: str, state: PolicyState) -> None: ...


class GuardrailRepository(Protocol):
    """The engine-wide guardrail windows (last action per target, recent executions)."""

    def guardrail_state(self) -> GuardrailState: ...
    def save_guardrail_state(self, db: Transaction, state: GuardrailState) -> None: ...


class DecisionRepository(Protocol):
    """Every recorded decision, where it stands and what the audit spool holds of it."""

    def record_decision(self, db: Transaction, decision: Decision, status: DecisionStatus) -> bool:
        """Insert a decision (``Audited.NOTHING``); False when its id is already known (a
        replay: do not act again)."""
        ...

    def record_decisions(
        self, db: Transaction, decisions: Sequence[tuple[Decision, DecisionStatus]]
    ) -> set[str]:
        """``record_decision`` of each, in order: the ids inserted (not replays, nor a repeat
        of an id earlier in ``decisions``)."""
        ...

    def rerun_decision(self, db: Transaction, decision: Decision) -> None:
        """A stored decision that runs after all (a granted approval): its new verdict,
        ``started``, no outcome, ``Audited.NOTHING`` — to be audited and run by the gate."""
        ...

    def finish_decision(
        self, decision_id: str, outcome: Outcome, held: Decision | None = None
    ) -> None:
        """Store a decision's outcome (``done``); ``held``: the decision with the verdict and
        reason the gate held it with."""
        ...

    def mark_audited(self, ids: Sequence[str], level: Audited) -> None:
        """The spool holds ``level`` of these decisions (never lowers it)."""
        ...

    def unaudited_ids(self, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` of ``unaudited``'s decisions, without reading them."""
        ...

    def unaudited(self, ids: Sequence[str] | None = None) -> list[StoredDecision]:
        """Decisions whose intent, or whose stored outcome, the spool lacks (``ids``: only
        among those), oldest first."""
        ...

    def unfinished(self) -> list[StoredDecision]:
        """Decisions ``started`` whose intent the spool holds and whose outcome never came (the
        engine stopped in between), oldest first. A decision whose intent is not written yet is
        never among them: only the gate's admission or reconciliation runs that one."""
        ...

    def mark_retried(self, decision_id: str, now: float) -> bool:
        """Accept an admin's retry of ``decision_id`` once: False when it was retried before
        (compare and set)."""
        ...

    def failures_in_episode(self, policy: str, target: str, episode_start: float) -> int: ...
    def decision(self, decision_id: str) -> StoredDecision | None: ...
    def stored_decisions(self, ids: Sequence[str]) -> dict[str, StoredDecision]:
        """The stored decisions among ``ids``, by id (``decision`` of many, in a few
        queries)."""
        ...

    def decisions(
        self, policy: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[StoredDecision]:
        """Newest first."""
        ...

    def prune(self, older_than: float) -> int:
        """Forget finished decisions and settled approvals older than ``older_than`` (the audit
        trail keeps them); returns how many went."""
        ...


class ApprovalRepository(Protocol):
    def save_approval(
        self, db: Transaction, decision: Decision, requested_at: float, expires_at: float
    ) -> None: ...
    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        """Newest first."""
        ...

    def approval(self, decision_id: str) -> Approval | None: ...
    def settle_approval(
        self,
        db: Transaction,
        decision_id: str,
        status: ApprovalStatus,
        user: str | None,
        now: float,
    ) -> Approval | None:
        """Move a pending approval to ``status`` inside ``db`` (a grant commits with the rerun
        of its decision); None when it was not pending any more."""
        ...

    def expired_approvals(self, now: float) -> list[Approval]: ...


class QuotaRepository(Protocol):
    def add_quota_request(self, request: QuotaRequest) -> None: ...
    def quota_request(self, request_id: str) -> QuotaRequest | None: ...
    def quota_requests(
        self, status: QuotaStatus | None = None, limit: int = 1000
    ) -> list[QuotaRequest]:
        """Newest first."""
        ...

    def move_quota_request(self, request: QuotaRequest, expected: QuotaStatus) -> bool:
        """Store ``request`` if the stored one is still in status ``expected`` (compare and
        set: two admins approving at once apply it once)."""
        ...


class AlertRepository(Protocol):
    """The durable inbox of received alerts, the handled episodes, and resolves that came
    before their firing's action succeeded."""

    def inbox_add(self, alerts: Sequence[Alert], now: float) -> list[int]: ...
    def inbox(self) -> list[InboxItem]:
        """Oldest first."""
        ...

    def inbox_done(self, item: int) -> None: ...
    def alerts_handled(self, keys: Sequence[AlertKey], items: Sequence[int], now: float) -> None:
        """Record the episodes ``keys`` (``seen_alert``) and take ``items`` out of the inbox
        (``inbox_done``), in one transaction: what the inbox's worker handled together."""
        ...

    def alert_known(self, key: AlertKey) -> bool: ...
    def known_alerts(self, keys: Sequence[AlertKey]) -> set[AlertKey]:
        """Those of ``keys`` recorded (``alert_known`` of many, in a few queries)."""
        ...

    def seen_alert(self, key: AlertKey, now: float) -> bool:
        """Record an episode; True when it was already recorded (a retried webhook)."""
        ...

    def forget_alert(self, key: AlertKey) -> None:
        """Forget a handled episode (its action was held: the next notification decides it
        again)."""
        ...

    def prune_alert_episodes(self, older_than: float) -> int: ...
    def save_early_resolve(self, fire_id: str, alert: Alert, now: float) -> None: ...
    def take_early_resolve(self, fire_id: str) -> Alert | None:
        """The resolved alert waiting for ``fire_id`` (removed: it is handled once)."""
        ...


class ControlRepository(Protocol):
    """Kill switch and pause as set through the API (``name`` → the JSON text of who and when)."""

    def control(self, name: str) -> str | None: ...
    def set_control(self, name: str, value: str | None) -> None: ...


class HealthRepository(Protocol):
    """The health events node agents pushed, by id (``gpuops.runtime.health``)."""

    def health_events_add(self, events: Sequence[HealthEvent], now: float) -> set[str]:
        """Keep ``events``; the ids of those not kept before."""
        ...

    def health_events_known(self, ids: Sequence[str]) -> set[str]: ...
    def health_xids(self, node: str, gpu: str, since: float) -> list[HealthEvent]:
        """One GPU's XIDs at or after ``since``, oldest first."""
        ...

    def health_returned(self, node: str) -> float | None:
        """``node``'s last return to service kept, or None."""
        ...

    def prune_health_events(self, older_than: float) -> int: ...


@dataclass(frozen=True)
class StoredBatch:
    """A batch operation as stored: its id, status and record (JSON text,
    ``gpuops.runtime.batch``), and when it was created."""

    id: str
    status: str
    data: str
    created_at: float


class BatchRepository(Protocol):
    """Batch operations and where each of their nodes is (``gpuops.runtime.batch``)."""

    def save_batch(self, batch: StoredBatch) -> None: ...
    def batch(self, batch_id: str) -> StoredBatch | None: ...
    def batches(self) -> list[StoredBatch]:
        """Every operation, oldest first."""
        ...

    def save_batch_node(self, batch_id: str, node: str, data: str) -> None: ...
    def batch_nodes(self, batch_id: str) -> dict[str, str]:
        """Each node's record (JSON text) by name."""
        ...


class RepairRepository(Protocol):
    """Each node's place on the remediation ladder and each failure domain's pace of repairs
    (``gpuops.runtime.ladder``)."""

    def save_repair(self, node: str, stage: str, data: str, now: float) -> None:
        """Keep ``node``'s record (JSON text) and its stage."""
        ...

    def repair(self, node: str) -> str | None: ...
    def repairs(self) -> dict[str, str]:
        """Every node's record (JSON text) by name."""
        ...

    def save_domain(self, domain: str, data: str) -> None:
        """Keep a failure domain's pace (JSON text)."""
        ...

    def domains(self) -> dict[str, str]: ...


class Store(
    PolicyStateRepository,
    GuardrailRepository,
    DecisionRepository,
    ApprovalRepository,
    QuotaRepository,
    AlertRepository,
    ControlRepository,
    HealthRepository,
    BatchRepository,
    RepairRepository,
    Protocol,
):
    """What the engine needs of its state backend. ``transaction()`` yields the backend's
    open transaction, handed back to the methods that take ``db``, so one commit holds a
    cycle's policy state, guardrail windows, decisions and approvals."""

    path: Path

    def close(self) -> None: ...
    def transaction(self) -> AbstractContextManager[Transaction]: ...
