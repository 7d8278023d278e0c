"""The ``slurm`` executor: acts on a Slurm cluster through ``scontrol``/``scancel`` (the
client of ``gpuops.integrations.slurm.client``: argv elements, never a shell; a timeout on every
call).

``gpuops.actions.base.execute`` calls ``run``; its dispatch table (``gpuops.actions.dispatch``)
routes each verb to its handler, which hands back a typed result (``Migrated``, ``Reclaimed``...).
Verbs and what they leave behind, so that a repeated decision id has no second effect and gpuops
never undoes what it did not do:

- ``migrate`` (label ``node``): drain the node with reason ``gpuops:<policy>:<decision id>`` and
  requeue its running jobs. A node already drained by someone else keeps their reason.
- ``resume`` (the undo of migrate, ``on_clear``): resume the node only while its drain reason
  is still ``gpuops:<policy>:…``; a node an admin drained (another reason) is left alone.
- ``reboot`` (label ``node``, a remediation step of the health ladder): ``scontrol reboot
  reason=gpuops:<policy>:<decision id> <node>`` of a node drained with ``gpuops:<policy>:…``
  only (never a node in service or one someone else drained); without ``nextstate`` Slurm keeps
  its drain, so it comes back drained with gpuops' reason and returns only through ``resume``.
  It waits until the node registered again (its ``RebootProgram`` ran; ``reboot_timeout_s``);
  a node whose reason names this decision and is no longer rebooting was rebooted by it.
- ``notify`` (labels ``job``, or ``node`` + ``uuid``): the warning step before a reclaim:
  ``scontrol notify`` writes it to the job's stderr, and the job's AdminComment records
  ``gpuops:warned:<decision id>@<epoch>``.
- ``reclaim``: requeue (or cancel, ``reclaim.how``) the job holding the idle GPU — only after
  its warning (``reclaim.require_warning``) and ``reclaim.warning_grace_s``, and never a job of
  an excluded user, account or partition.
- ``scale_out`` / ``scale_in`` (label ``pool`` = partition): power up powered-down (CLOUD)
  nodes of the partition, marking each with node comment ``gpuops:scale_out:<decision id>``
  and resuming it when it was a standby node (drained with a ``gpuops:`` reason, which keeps
  Slurm's power saving from waking it for pending jobs on its own); power down (drained first,
  so no job lands on it meanwhile) only idle nodes that carry the mark. Slurm clears the drain
  once a node is powered down: from then on its own power saving may wake it again.

A GPU named by ``node`` + ``uuid`` is mapped to its job through Prometheus
(``gpuops_gpu_allocated{node, uuid}``, the join of the Slurm and NVML exporters), asked at the
moment of acting: no job holds it now → nothing is reclaimed. Errors: slurmctld or Prometheus
unreachable → ``TemporaryError``; Slurm refusing, an odd node name, a job not warned →
``PermanentError``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import requests
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.config import settings_of
from gpuops.actions.dispatch import Dispatch, on
from gpuops.actions.encoding import printable, target_label
from gpuops.actions.promlookup import series_ages, too_old
from gpuops.actions.results import Result
from gpuops.integrations.slurm.client import (
    SlurmClient,
    SlurmRejected,
    SlurmUnavailable,
    check_job_id,
    check_name,
    job_nodes,
)
from gpuops.integrations.slurm.nodes import node_state
from gpuops.model.decisions import Decision
from gpuops.model.guardrails import Standing
from gpuops.model.verbs import (
    MIGRATE,
    NOTIFY,
    REBOOT,
    RECLAIM,
    RESUME,
    SCALE_IN,
    SCALE_OUT,
    NoParams,
    RebootParams,
    ScaleParams,
    implemented_by,
)

log = logging.getLogger(__name__)

ACTIVE_JOB_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReclaimSettings(_Model):
    """How a job's idle GPUs are taken back (Princeton's Job Defense Shield does the same:
    warn, wait, then cancel, with exclusions)."""

    how: Literal["requeue", "cancel"] = "requeue"
    """requeue: the job goes back to the queue and starts again later; cancel: it ends."""
    require_warning: bool = True
    """Reclaim only a job that a ``notify`` decision warned first."""
    warning_grace_s: float = Field(default=0.0, ge=0)
    """Seconds between the warning and the reclaim (the policies' ``for`` usually sets the
    pace; this is a floor the executor enforces whatever the policies say)."""
    exclude_users: frozenset[str] = frozenset()
    exclude_accounts: frozenset[str] = frozenset()
    exclude_partitions: frozenset[str] = frozenset()


class SlurmSettings(_Model):
    """``executors.slurm`` in the engine configuration. Unknown keys are errors."""

    slurm_conf: str | None = None
    """slurm.conf of the cluster (``SLURM_CONF``); None: Slurm's default."""
    bin_dir: str | None = None
    """Directory of scontrol/squeue/sinfo/scancel; None: PATH."""
    timeout_s: PositiveFloat = 10.0
    """Seconds one Slurm command may take (they hang while slurmctld is down)."""
    prometheus_url: str | None = None
    """Where ``gpuops_gpu_allocated`` maps a GPU (node, uuid) to its job (reclaim, notify by
    GPU). The engine configuration fills it with ``prometheus.url`` when not set."""
    max_sample_age_s: PositiveFloat = 30.0
    """Seconds: a ``gpuops_gpu_allocated`` series whose newest sample is older names no job
    (fresh data only); the engine configuration fills it with the engine's bound,
    ``prometheus.max_sample_age`` (default 2 x ``prometheus.scrape_interval``)."""
    reason_prefix: str = Field(default="gpuops", pattern=r"^[A-Za-z0-9_.-]+$")
    """First word of every drain reason and comment gpuops writes: how it knows its own."""
    reclaim: ReclaimSettings = ReclaimSettings()
    reboot_timeout_s: PositiveFloat = 900.0
    """Seconds a ``reboot`` waits for the node to register again (Slurm marks it down after
    its own ``ResumeTimeout``)."""
    reboot_poll_s: PositiveFloat = 1.0
    """Seconds between two looks at a rebooting node."""
    veto_feature: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """A Slurm node feature that vetoes every action on the node (``scontrol update
    NodeName=N AvailableFeatures=...,gpuops_do_not_touch``): the gate holds them
    (``suppressed:veto``) and decides them again later. None: no veto (one ``sinfo`` fewer
    per action)."""


# --- results ---------------------------------------------------------------------------------


class Migrated(Result):
    node: str
    drained: bool
    """Drained by this decision (False: someone else's drain was found, and kept)."""
    reason: str
    """The node's drain reason now."""
    requeued_jobs: list[str]


class Resumed(Result):
    node: str
    resumed: bool
    why: str | None = None
    """Why not (not drained; drained by someone else)."""
    reason_was: str | None = None


class Rebooted(Result):
    node: str
    rebooted: bool
    already: bool | None = None
    """This decision's reboot was found done: it ran before."""
    reason: str
    """The node's drain reason now (gpuops' own: it stays drained)."""


class Warned(Result):
    job: str
    warned: bool
    excluded: str | None = None
    """The exclusion that spared the job (``user root``)."""
    already: bool | None = None
    message: str | None = None
    """What the job's stderr was told."""


class Reclaimed(Result):
    job: str
    reclaimed: bool
    excluded: str | None = None
    already: bool | None = None
    why: str | None = None
    """Why not (the job no longer runs)."""
    how: Literal["requeue", "cancel"] | None = None
    user: str | None = None


class Powered(Result):
    pool: str
    powered_up: list[str] | None = None
    powered_down: list[str] | None = None
    already: bool | None = None
    """This decision's nodes were found marked: it ran before."""
    why: str | None = None
    """Why no node was powered down (none of the partition's idle nodes is one gpuops
    powered up): the action ran and changed nothing."""


class SlurmExecutor:
    name = "slurm"
    verbs: frozenset[str] | None = implemented_by("slurm")

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings_of(SlurmSettings, self.name, settings)
        s = self.settings
        self.client = SlurmClient(conf=s.slurm_conf, timeout_s=s.timeout_s, bin_dir=s.bin_dir)
        self.clock = clock
        self.session = requests.Session()

    def run(self, decision: Decision) -> Result:
        try:
            return DISPATCH.run(self, decision)
        except SlurmUnavailable as exc:
            raise TemporaryError(f"slurmctld: {exc}") from exc
        except SlurmRejected as exc:
            verb = decision.action.type if decision.action is not None else ""
            raise PermanentError(f"Slurm refused {verb}: {exc}") from exc

    def standing(self, decision: Decision) -> Standing | None:
        """The veto on the target's node (``veto_feature``), asked by the gate before the
        action runs; None without a veto feature, a node label, or an answer from Slurm (the
        run meets the same problem and its outcome says it)."""
        feature = self.settings.veto_feature
        name = decision.target.labels.get("node")
        if not feature or not name:
            return None
        try:
            node = self.client.node(name)
        except (SlurmUnavailable, SlurmRejected):
            return None
        if feature in _features(node):
            return Standing(veto=f"node {name} has the Slurm feature {feature}")
        return Standing()

    def _mark(self, kind: str, decision: Decision) -> str:
        return f"{self.settings.reason_prefix}:{kind}:{decision.id}"

    # --- nodes: migrate / resume ----------------------------------------------------------

    def _migrate(self, d: Decision, _: NoParams) -> Migrated:
        node_name = _label(d, "node")
        reason = self._mark(d.policy, d)
        node = self.client.node(node_name)
        current = str(node.get("reason") or "")
        drained = "DRAIN" in {str(f).upper() for f in node.get("state_flags") or []}
        if drained and current != reason:
            drained_by_us = False  # an admin's (or an earlier) drain: their reason stays
            log.info("node %s already drained (%r); not replacing the reason", node_name, current)
        else:
            drained_by_us = True
            if not drained:
                self.client.scontrol(
                    "update", f"nodename={node_name}", "state=drain", f"reason={reason}"
                )
        requeued = self._requeue_jobs_on(node_name)
        return Migrated(
            node=node_name,
            drained=drained_by_us,
            reason=reason if drained_by_us else current,
            requeued_jobs=requeued,
        )

    def _requeue_jobs_on(self, node_name: str) -> list[str]:
        ids = [
            str(job.get("job_id"))
            for job in self.client.jobs()
            if str(job.get("job_state", "")).upper() in ACTIVE_JOB_STATES
            and node_name in job_nodes(self.client, job)
        ]
        for job_id in ids:
            try:
                self.client.scontrol("requeue", check_job_id(job_id))
            except SlurmRejected as exc:  # not requeueable (--no-requeue), or just ended
                log.warning("job %s on %s not requeued: %s", job_id, node_name, exc)
        return ids

    def _resume(self, d: Decision, _: NoParams) -> Resumed:
        node_name = _label(d, "node")
        node = self.client.node(node_name)
        reason = str(node.get("reason") or "")
        ours = reason.startswith(f"{self.settings.reason_prefix}:{d.policy}:")
        drained = "DRAIN" in {str(f).upper() for f in node.get("state_flags") or []}
        if not drained:
            return Resumed(node=node_name, resumed=False, why="not drained")
        if not ours:
            log.info("node %s drained with reason %r (not ours): left drained", node_name, reason)
            return Resumed(node=node_name, resumed=False, why=f"drained by someone else: {reason}")
        self.client.scontrol("update", f"nodename={node_name}", "state=resume")
        return Resumed(node=node_name, resumed=True, reason_was=reason)

    def _reboot(self, d: Decision, params: RebootParams) -> Rebooted:
        node_name = _label(d, "node")
        mark = self._mark(d.policy, d)
        node = self.client.node(node_name)
        reason = str(node.get("reason") or "")
        flags = _flags(node)
        if "DRAIN" not in flags or not reason.startswith(
            f"{self.settings.reason_prefix}:{d.policy}:"
        ):
            raise PermanentError(
                f"node {node_name} is not drained by gpuops ({d.policy}): state"
                f" {node.get('state')} {sorted(flags)}, reason {reason!r}; a node in service or"
                f" drained by someone else is never rebooted"
            )
        rebooting = flags & REBOOTING
        if reason.startswith(mark) and not rebooting:
            return Rebooted(node=node_name, rebooted=True, already=True, reason=reason)
        if not rebooting:
            self.client.scontrol("reboot", f"reason={mark}", node_name)
            log.info("node %s: reboot issued (%s)", node_name, mark)
        timeout_s = params.timeout_s or self.settings.reboot_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            node = self.client.node(node_name)
            flags, reason = _flags(node), str(node.get("reason") or "")
            if not flags & REBOOTING:
                break
            if time.monotonic() > deadline:
                raise TemporaryError(
                    f"node {node_name} did not come back within {timeout_s:g} s of its reboot"
                    f" ({sorted(flags)}, reason {reason!r})"
                )
            time.sleep(self.settings.reboot_poll_s)
        state = str(node.get("state", "")).lower()
        if state == "down" or "DRAIN" not in flags or "reboot timed out" in reason:
            raise PermanentError(
                f"node {node_name} did not come back drained from its reboot: state {state}"
                f" {sorted(flags)}, reason {reason!r}"
            )
        return Rebooted(node=node_name, rebooted=True, reason=reason)

    # --- jobs: notify / reclaim -----------------------------------------------------------

    def _notify(self, d: Decision, _: NoParams) -> Warned:
        job = self._job_of(d)
        job_id = str(job["job_id"])
        if (excluded := self._excluded(job)) is not None:
            return Warned(job=job_id, warned=False, excluded=excluded)
        comment = str(job.get("admin_comment") or "")
        if self._mark("warned", d) in comment:
            return Warned(job=job_id, warned=True, already=True)
        # label values are data: quoted, control characters escaped (no line is forged in the
        # job's stderr)
        uuid = d.target.labels.get("uuid")
        gpu = f"GPU {printable(uuid)}" if uuid else "its GPU"
        node = printable(str(d.target.labels.get("node", job.get("nodes", ""))))
        how = "requeued" if self.settings.reclaim.how == "requeue" else "cancelled"
        message = (
            f"gpuops: {gpu} on {node} has been idle; "
            f"this job will be {how} unless it uses it (policy {d.policy})"
        )
        try:
            self.client.scontrol("notify", job_id, message)
        except SlurmRejected as exc:  # the job has no step to write to yet: the mark stays
            log.info("job %s: scontrol notify failed: %s", job_id, exc)
        mark = f"{self._mark('warned', d)}@{int(self.clock())}"
        self._set_admin_comment(job_id, comment, mark)
        return Warned(job=job_id, warned=True, message=message)

    def _reclaim(self, d: Decision, _: NoParams) -> Reclaimed:
        job = self._job_of(d)
        job_id = str(job["job_id"])
        settings = self.settings.reclaim
        if (excluded := self._excluded(job)) is not None:
            return Reclaimed(job=job_id, reclaimed=False, excluded=excluded)
        comment = str(job.get("admin_comment") or "")
        mark = self._mark("reclaimed", d)
        state = str(job.get("job_state", "")).upper()
        if mark in comment:  # this decision ran before (the job may be running again since)
            return Reclaimed(job=job_id, reclaimed=True, already=True, how=settings.how)
        if settings.require_warning:
            warned = re.findall(
                rf"{re.escape(self.settings.reason_prefix)}:warned:\w+@(\d+)", comment
            )
            if not warned:
                raise PermanentError(
                    f"job {job_id} was not warned first (no '{self.settings.reason_prefix}:warned' "
                    "in its AdminComment): a notify policy must warn before reclaim acts"
                )
            waited = self.clock() - int(warned[-1])
            if waited < settings.warning_grace_s:
                raise TemporaryError(
                    f"job {job_id} was warned {waited:.0f} s ago; reclaim waits "
                    f"{settings.warning_grace_s:g} s",
                    delay=settings.warning_grace_s - waited,
                )
        if state not in ACTIVE_JOB_STATES:
            return Reclaimed(job=job_id, reclaimed=False, why=f"job is {state.lower()}")
        if settings.how == "requeue":
            self.client.scontrol("requeue", job_id)
        else:
            self.client.run("scancel", job_id)
        # After the act, so that a failed requeue is retried; a crash in between leaves a job
        # that is not running, which a replay leaves alone. A cancelled job takes no comment.
        try:
            self._set_admin_comment(job_id, comment, mark)
        except SlurmRejected as exc:
            log.info("job %s: reclaim mark not written: %s", job_id, exc)
        return Reclaimed(job=job_id, reclaimed=True, how=settings.how, user=job.get("user_name"))

    def _set_admin_comment(self, job_id: str, current: str, mark: str) -> None:
        text = f"{current};{mark}" if current else mark
        self.client.scontrol("update", f"jobid={job_id}", f"admincomment={text[-1024:]}")

    def _excluded(self, job: Mapping[str, Any]) -> str | None:
        s = self.settings.reclaim
        for kind, value, excluded in (
            ("user", job.get("user_name"), s.exclude_users),
            ("account", job.get("account"), s.exclude_accounts),
            ("partition", job.get("partition"), s.exclude_partitions),
        ):
            if value and str(value) in excluded:
                return f"{kind} {value}"
        return None

    def _job_of(self, d: Decision) -> Mapping[str, Any]:
        labels = d.target.labels
        job_id = labels.get("job") if re.fullmatch(r"[0-9_]+", labels.get("job", "")) else None
        if job_id is None:
            job_id = self._job_holding(_label(d, "node"), _label(d, "uuid"))
        return self.client.job(check_job_id(job_id))

    def _job_holding(self, node: str, uuid: str) -> str:
        """The job ``gpuops_gpu_allocated`` says holds GPU ``uuid`` of ``node`` now, read from
        series at most ``max_sample_age_s`` old (``gpuops.actions.promlookup``): an older one
        names no job, and the action waits."""
        url = self.settings.prometheus_url
        if not url:
            raise PermanentError(
                "executors.slurm.prometheus_url is not set: a GPU (node, uuid) cannot be mapped "
                "to its Slurm job (or give the policy a target with the 'job' label)"
            )
        selector = f'gpuops_gpu_allocated{{node="{_promql_str(node)}",uuid="{_promql_str(uuid)}"}}'
        found = series_ages(
            url, selector, self.settings.timeout_s, f"which job holds {uuid}", "== 1", self.session
        )
        max_age_s = self.settings.max_sample_age_s
        jobs = sorted({s.labels.get("job", "") for s in found if s.age_s <= max_age_s} - {""})
        if not jobs and found:
            newest = min(found, key=lambda s: s.age_s)
            raise too_old(
                f"the job of GPU {uuid} on {node}",
                f"job {newest.labels.get('job', '?')}",
                newest.age_s,
                max_age_s,
                "executors.slurm.max_sample_age_s",
                selector,
            )
        if len(jobs) != 1:
            raise PermanentError(
                f"GPU {uuid} on {node}: {'no job holds it now' if not jobs else f'held by {jobs}?'}"
                f" ({selector} == 1)"
            )
        return jobs[0]

    # --- capacity: scale_out / scale_in ---------------------------------------------------

    def _scale_out(self, d: Decision, params: ScaleParams) -> Powered:
        return self._power(
            d, params, SCALE_OUT.name, "power_up", lambda n: node_state(n) == "powered_down"
        )

    def _scale_in(self, d: Decision, params: ScaleParams) -> Powered:
        ours = f"{self.settings.reason_prefix}:{SCALE_OUT.name}:"
        return self._power(
            d,
            params,
            SCALE_IN.name,
            "power_down",
            lambda n: str(n.get("comment") or "").startswith(ours) and node_state(n) == "idle",
        )

    def _power(
        self,
        d: Decision,
        params: ScaleParams,
        verb: str,
        state: str,
        eligible: Callable[[Mapping[str, Any]], bool],
    ) -> Powered:
        """Mark (node comment) and power up/down ``params.nodes`` eligible nodes of the pool;
        nodes already marked with this decision id mean it ran before."""
        partition, count = _pool(d, params), params.nodes
        mark = self._mark(verb, d)
        key = "powered_up" if state == "power_up" else "powered_down"
        nodes = [n for n in self.client.nodes() if partition in (n.get("partitions") or [])]
        done = sorted(str(n["name"]) for n in nodes if n.get("comment") == mark)
        if done:
            return Powered.model_validate({"pool": partition, key: done, "already": True})
        candidates = sorted(str(n["name"]) for n in nodes if eligible(n))
        if not candidates and state == "power_up":
            raise PermanentError(
                f"partition {partition} has no powered-down (CLOUD) node left to power up"
            )
        if not candidates:  # scale_in: said as what it is, not as a node powered down
            why = f"no idle node of partition {partition} is one gpuops powered up"
            return Powered.model_validate({"pool": partition, key: [], "why": why})
        chosen = [check_name("node", n) for n in candidates[:count]]
        by_name = {str(n["name"]): n for n in nodes}
        ours = f"{self.settings.reason_prefix}:"
        for name in chosen:
            update = ("update", f"nodename={name}")
            self.client.scontrol(*update, f"comment={mark}")
            if state == "power_down":  # no job may land on it while it powers down
                self.client.scontrol(*update, "state=drain", f"reason={mark}")
            self.client.scontrol(*update, f"state={state}")
            node = by_name[name]
            standby = "DRAIN" in {str(f).upper() for f in node.get("state_flags") or []}
            if state == "power_up" and standby and str(node.get("reason", "")).startswith(ours):
                self.client.scontrol(*update, "state=resume")  # a gpuops standby node
        return Powered.model_validate({"pool": partition, key: chosen})


def _pool(d: Decision, params: ScaleParams) -> str:
    return check_name("partition", _partition(d, params.pool))


def _pool_first(d: Decision) -> None:
    pool = d.action.params.get("pool") if d.action is not None else None
    _partition(d, None if pool is None else str(pool))


def _partition(d: Decision, pool: str | None) -> str:
    """The target's ``pool`` label, else the ``pool`` param: the partition."""
    partition = d.target.labels.get("pool") or (pool or "")
    if not partition:
        raise PermanentError(f"{d.action.type if d.action else ''} needs a 'pool' label")
    return partition


REBOOTING = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
"""A node's state flags while a reboot is pending or under way."""


def _flags(node: Mapping[str, Any]) -> set[str]:
    return {str(f).upper() for f in node.get("state_flags") or []}


def _features(node: Mapping[str, Any]) -> set[str]:
    """A node's available and active features (``sinfo --json``: text, comma-separated, in
    22.05; a list in later releases)."""
    found: set[str] = set()
    for key in ("features", "active_features"):
        value = node.get(key) or ()
        items = value.split(",") if isinstance(value, str) else value
        found.update(str(item).strip() for item in items if str(item).strip())
    return found


def _label(d: Decision, name: str) -> str:
    value = target_label(d, name)
    if name == "node":
        try:
            return check_name("node", value)
        except SlurmRejected as exc:
            raise PermanentError(str(exc)) from None
    return value


def _promql_str(value: str) -> str:
    """``value`` inside a PromQL double-quoted string (labels are data)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


DISPATCH: Dispatch[SlurmExecutor, Result] = Dispatch(
    SlurmExecutor.name,
    (
        on(MIGRATE, SlurmExecutor._migrate),
        on(RESUME, SlurmExecutor._resume),
        on(REBOOT, SlurmExecutor._reboot),
        on(NOTIFY, SlurmExecutor._notify),
        on(RECLAIM, SlurmExecutor._reclaim),
        on(SCALE_OUT, SlurmExecutor._scale_out, first=_pool_first),
        on(SCALE_IN, SlurmExecutor._scale_in, first=_pool_first),
    ),
)
"""Slurm's verbs, each to its handler; a scale's partition is asked for before its params."""
