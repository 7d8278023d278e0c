"""Decisions in words: a value as what it is, what an executor changed as sentences, where a
decision stands, and counts with their plurals.

Pure functions over the values of ``gpuops.model.decisions`` and the JSON form of an outcome's
``changed`` (as stored, so that old outcomes read as well as new ones). Read by the engine's
decision log lines (``gpuops.runtime.gate.told``), the API's explanation and the console
(``gpuops.api``), the CLI and the demos' summaries.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuops.model.decisions import Outcome, OutcomeStatus, Suppression, Transition, Verdict


def plural(n: float, noun: str, nouns: str | None = None) -> str:
    """``1 attempt``, ``2 attempts``, ``0.5 GPUs`` (``nouns``: an irregular plural); a whole
    float reads as an integer (``3.0`` as ``3``)."""
    count = f"{int(n)}" if n == int(n) else f"{n:g}"
    return f"{count} {noun if n == 1 else (nouns or noun + 's')}"


# --- values --------------------------------------------------------------------------------

_UP = re.compile(r"^\s*\(?\s*up\s*(\{[^}]*\})?\s*\)?\s*==\s*0\s*$")
_RATIO = re.compile(r"(_ratio\b|_fraction\b|utili[sz]ation)")
_COUNT = re.compile(r"(\bcount\s*(by|without)?\s*\(|_jobs\b|_nodes\b|_gpus\b|_total\b)")


def value_in_words(expr: str, value: float | None) -> str:
    """What a policy's expression returned, as what it is: ``down`` for a target whose
    ``up == 0`` matched, a percentage for a ratio, a whole count for counts, else a number of
    at most 4 significant digits."""
    if value is None:
        return "no value"
    if value != value:  # NaN
        return "not a number"
    if _UP.match(expr) and value == 0:
        return "down"
    if _RATIO.search(expr) and 0 <= value <= 1:
        return f"{value * 100:.{0 if value * 100 >= 10 or value == 0 else 1}f}%"
    if _COUNT.search(expr) and value == int(value):
        return f"{int(value)}"
    return f"{value:.4g}"


def expr_lines(expr: str) -> list[str]:
    """A (multi-line) PromQL expression as its lines, trailing blanks dropped."""
    return [line.rstrip() for line in expr.strip("\n").splitlines()] or [""]


# --- what the executor changed -------------------------------------------------------------


def _names(value: Any) -> str:
    """A list of names (jobs, nodes, GPUs) as text: ``a, b and c``."""
    items = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _jobs(value: Any) -> str:
    """Job ids as text: Slurm's bare numbers as ``job 7`` / ``jobs 7 and 8``; named ones
    (``job-1``) as they are."""
    items = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    if items and all(v.isdigit() for v in items):
        return f"job{'s' if len(items) > 1 else ''} {_names(items)}"
    return _names(items)


def _mhz(value: Any) -> str:
    return "not capped" if value is None else f"{value} MHz"


@dataclass(frozen=True)
class Effect:
    """What an action did, told: ``sentences`` (each a clause), and whether it did its verb
    (``did``: False for an action that ran and changed nothing its verb promises — a migrate
    that moved no job, a scale-in that powered nothing down)."""

    sentences: tuple[str, ...]
    did: bool

    @property
    def text(self) -> str:
        return "; ".join(self.sentences)


_Teller = Callable[[Mapping[str, Any]], Effect]


def _migrate(c: Mapping[str, Any]) -> Effect:
    node = c.get("node", "the node")
    out: list[str] = []
    if "requeued_jobs" in c:  # Slurm: drain and requeue (the scheduler starts them elsewhere)
        if c.get("drained"):
            out.append(f"{node} drained")
        else:
            out.append(f"{node} already drained by someone else ({c.get('reason')}): kept")
        jobs = c.get("requeued_jobs") or []
        out.append(f"{_jobs(jobs)} requeued to run elsewhere" if jobs else "no job was running")
        return Effect(tuple(out), bool(c.get("drained")) or bool(jobs))
    moved = c.get("moved") or []
    requeued = c.get("requeued") or []
    out.append(f"{node} drained")
    out += [f"{m.get('job')} moved to {m.get('to')}" for m in moved if isinstance(m, Mapping)]
    if requeued:
        out.append(f"{_jobs(requeued)} requeued: no free node")
    if not moved:
        out.append("no job moved" if requeued else "no job was running")
    return Effect(tuple(out), bool(moved))


def _resume(c: Mapping[str, Any]) -> Effect:
    node = c.get("node", "the node")
    if c.get("resumed") is False:
        return Effect((f"{node} not resumed: {c.get('why') or 'not drained by gpuops'}",), False)
    if c.get("reason_was"):  # Slurm: the drain reason gpuops had set
        return Effect((f"{node} resumed (drained as {c['reason_was']})",), True)
    was = c.get("previous")
    return Effect((f"{node} back in service" + (f" (was {was})" if was else ""),), True)


def _clocks(c: Mapping[str, Any]) -> Effect:
    gpu = c.get("uuid", "the GPU")
    where = f" on {c['node']}" if c.get("node") else ""
    cap, previous = c.get("max_clock_mhz"), c.get("previous")
    if cap is None:
        return Effect((f"clock cap of {gpu}{where} removed (was {_mhz(previous)})",), True)
    was = "were not capped" if previous is None else f"were {previous}"
    return Effect((f"clocks of {gpu}{where} capped at {cap} MHz, {was}",), True)


def _reclaim(c: Mapping[str, Any]) -> Effect:
    job = _jobs(c["job"]) if "job" in c else "the job"
    if c.get("excluded"):
        return Effect((f"{job} spared: {c['excluded']} is excluded",), False)
    if c.get("reclaimed") is False:
        return Effect((f"{job} not reclaimed: {c.get('why') or 'nothing to take'}",), False)
    if c.get("already"):
        return Effect((f"{job} was reclaimed before",), False)
    if "how" in c:  # Slurm
        who = f" (user {c['user']})" if c.get("user") else ""
        how = "cancelled" if c.get("how") == "cancel" else "requeued"
        return Effect((f"{job}{who} {how}: its GPU is free",), True)
    released, again = c.get("released_gpus") or [], c.get("restarted_on") or []
    project = f" of {c['project']}" if c.get("project") else ""
    how = "requeued" if c.get("requeued") else "ended"
    out = [f"{job}{project} {how}"]
    if released:
        out.append(f"{_names(released)} freed")
    if again:
        out.append(f"it started again on {_names(again)}")
    return Effect(tuple(out), bool(released))


def _notify(c: Mapping[str, Any]) -> Effect:
    job = _jobs(c["job"]) if "job" in c else "the job"
    if c.get("excluded"):
        return Effect((f"{job} not warned: {c['excluded']} is excluded",), False)
    if c.get("already"):
        return Effect((f"{job} was warned before",), False)
    if c.get("warned"):
        said = f": {c['message']!s}" if c.get("message") else ""
        return Effect((f"{job} warned{said}",), True)
    return Effect((f"{job} not warned",), False)


def _power(c: Mapping[str, Any]) -> Effect:
    pool = c.get("pool")
    for key, done, prep in (
        ("added", "added", "to"),
        ("powered_up", "powered up", "in"),
        ("removed", "removed", "from"),
        ("powered_down", "powered down", "in"),
    ):
        if key in c:
            where = f" {prep} pool {pool}" if pool else ""
            nodes = c.get(key) or []
            if c.get("already"):
                return Effect((f"{_names(nodes)} {done}{where} before",), False)
            if not nodes:
                why = f": {c['why']}" if c.get("why") else ""
                return Effect((f"no node {done}{where}{why}",), False)
            return Effect((f"{_names(nodes)} {done}{where}",), True)
    return _generic(c)


def _pack(c: Mapping[str, Any]) -> Effect:
    job = c.get("job", "the job")
    if c.get("left_whole"):
        return Effect((f"{job} left on its whole GPU: {c['left_whole']}",), False)
    if c.get("to") == c.get("from"):
        return Effect((f"{job}'s GPUs shared in place on {c.get('to')}",), True)
    return Effect((f"{job} moved from {c.get('from')} onto shared GPUs of {c.get('to')}",), True)


def _consolidate(c: Mapping[str, Any]) -> Effect:
    node = c.get("node", "the node")
    moved = c.get("moved") or []
    out = [f"{m.get('job')} moved to {m.get('to')}" for m in moved if isinstance(m, Mapping)]
    out.append(f"{node} emptied and powered down")
    return Effect(tuple(out), True)


def _by_flag(did: str, undid: str, key: str, subject: str) -> _Teller:
    def tell(c: Mapping[str, Any]) -> Effect:
        return Effect((f"{c.get(subject, '')} {did if c.get(key) else undid}".strip(),), True)

    return tell


_MIGRATED = frozenset({"moved", "requeued", "requeued_jobs"})
_POWERED = frozenset({"added", "powered_up", "removed", "powered_down"})
_RECLAIMED = frozenset({"reclaimed", "released_gpus", "requeued", "excluded", "already", "how"})
_TELLERS: Mapping[str, tuple[_Teller, frozenset[str]]] = {
    "migrate": (_migrate, _MIGRATED),
    "resume": (_resume, frozenset({"resumed", "previous", "reason_was"})),
    "downclock": (_clocks, frozenset({"max_clock_mhz"})),
    "restore_clocks": (_clocks, frozenset({"max_clock_mhz"})),
    "reclaim": (_reclaim, _RECLAIMED),
    "notify": (_notify, frozenset({"warned"})),
    "scale_out": (_power, _POWERED),
    "scale_in": (_power, _POWERED),
    "pack": (_pack, frozenset({"to", "left_whole"})),
    "consolidate": (_consolidate, frozenset({"moved", "powered_down"})),
    "hold_class": (_by_flag("held", "released", "held", "priority_class"), frozenset({"held"})),
    "release_class": (
        _by_flag("held", "released", "held", "priority_class"),
        frozenset({"held"}),
    ),
    "lend": (
        _by_flag("lends its idle GPUs", "lends nothing", "lending", "pool"),
        frozenset({"lending"}),
    ),
    "unlend": (
        _by_flag("lends its idle GPUs", "took its lent GPUs back", "lending", "pool"),
        frozenset({"lending"}),
    ),
}
"""The verbs whose results gpuops' executors make, each with the keys that say a result is
of that shape; any other result (a webhook's answer, a third party's) is told key by key."""

_BOOKKEEPING = frozenset({"executor", "agent"})
"""Keys that say who acted, not what changed."""


def _plain(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return _names(value) if value else "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items()) or "none"
    return str(value)


def _generic(c: Mapping[str, Any]) -> Effect:
    """A result gpuops does not know the shape of (a webhook's answer, a third party's)."""
    if "logged" in c and len(c) == 1:
        return Effect(("recorded in the log only: nothing changed",), True)
    if "exit_code" in c:
        return Effect(
            (f"ran {' '.join(map(str, c.get('argv') or []))} (exit {c['exit_code']})",), True
        )
    if "status" in c and "url" in c and len(c) == 2:
        return Effect((f"delivered to {c['url']} (HTTP {c['status']})",), True)
    return Effect(tuple(f"{k.replace('_', ' ')}: {_plain(v)}" for k, v in c.items()), True)


def effect(verb: str | None, changed: Mapping[str, Any]) -> Effect:
    """What an action of ``verb`` changed, as sentences, from its outcome's ``changed``
    (``{}``: the executor found it done already, or had nothing to do)."""
    shown = {k: v for k, v in changed.items() if k not in _BOOKKEEPING}
    if not shown:
        return Effect(("nothing changed: already so, or nothing to do",), False)
    teller, keys = _TELLERS.get(verb or "", (_generic, frozenset()))
    if keys.isdisjoint(shown):
        return _generic(shown)
    try:
        return teller(shown)
    except (AttributeError, TypeError, ValueError):  # a shape this verb's tellers do not know
        return _generic(shown)


# --- where a decision stands ---------------------------------------------------------------


class State(StrEnum):
    """Where a decision stands, as the console and the log say it."""

    WAITING = "waiting for approval"
    HELD = "held"
    DENIED = "denied"
    """An admin denied its approval: it never ran."""
    EXPIRED = "expired"
    """Nobody approved it in time: it never ran."""
    CANCELLED = "cancelled"
    """Its target cleared while it waited for approval: it never ran."""
    DRY_RUN = "dry run"
    RUNNING = "running"
    DONE = "done"
    NO_EFFECT = "no effect"
    FAILED = "failed"
    UNDONE = "undone"
    RECORDED = "recorded"
    """A decision without an action (a clear with nothing to undo)."""


_SETTLED = {
    Suppression.DENIED: State.DENIED,
    Suppression.APPROVAL_EXPIRED: State.EXPIRED,
    Suppression.APPROVAL_CANCELLED: State.CANCELLED,
}
"""The states of a decision whose approval was settled without running it."""


def state(
    verdict: Verdict,
    *,
    has_action: bool,
    started: bool,
    outcome: Outcome | None,
    verb: str | None = None,
    undone: bool = False,
) -> State:
    """The true state of a decision: its verdict, whether it still runs (``started``), its
    outcome, and whether its undo ran since (``undone``)."""
    if verdict is Verdict.AWAITING_APPROVAL:
        return State.WAITING
    if verdict is Verdict.DRY_RUN:
        return State.DRY_RUN
    if verdict.suppression is not None:
        return _SETTLED.get(verdict.suppression, State.HELD)
    if not has_action:
        return State.RECORDED
    if outcome is None:
        return State.RUNNING if started else State.RECORDED
    if outcome.status is OutcomeStatus.FAILURE:
        return State.FAILED
    if outcome.status is OutcomeStatus.SKIPPED:
        return State.HELD
    if undone:
        return State.UNDONE
    return State.DONE if effect(verb, outcome.changed).did else State.NO_EFFECT


def outcome_words(outcome: Outcome, verb: str | None) -> str:
    """An outcome in one line: ``done after 1 attempt: node-3 drained; …``."""
    tries = plural(outcome.attempts, "attempt")
    if outcome.status is OutcomeStatus.FAILURE:
        kind = "failed for good" if outcome.permanent else "failed"
        return f"{kind} after {tries}: {outcome.error or 'no error given'}"
    if outcome.status is OutcomeStatus.SKIPPED:
        return f"not run: {outcome.error or 'held'}"
    told = effect(verb, outcome.changed)
    return f"{'done' if told.did else 'no effect'} after {tries}: {told.text}"


_HELD: Mapping[Suppression, str] = {
    Suppression.KILL_SWITCH: "held by the kill switch",
    Suppression.PAUSED: "held: the engine is paused",
    Suppression.COOLDOWN: "held by the cooldown",
    Suppression.MAX_PER_HOUR: "held by max_per_hour",
    Suppression.MAX_FRACTION: "held by max_fraction (blast radius)",
    Suppression.GLOBAL_BUDGET: "held by the global budget",
    Suppression.APPROVAL_CANCELLED: "cancelled: its target cleared before approval",
    Suppression.APPROVAL_EXPIRED: "not approved in time",
    Suppression.DENIED: "denied",
    Suppression.POLICY_REMOVED: "held: its policy is no longer loaded",
    Suppression.EXPIRED: "held: too old to run (guardrails.action_max_age)",
    Suppression.VETO: "held by a veto on the target",
    Suppression.PACED: "held by the pace of repairs in its failure domain",
}


def verdict_words(verdict: Verdict, reason: str) -> str:
    """A verdict as a reader says it: ``held by the cooldown: …``."""
    suppression = verdict.suppression
    if suppression is not None:
        words = _HELD.get(suppression, f"held: {suppression.value}")
    else:
        words = {
            Verdict.EXECUTE: "runs",
            Verdict.DRY_RUN: "dry run: recorded, not run",
            Verdict.AWAITING_APPROVAL: "waits for an admin's approval",
        }.get(verdict, verdict.value)
    return f"{words}: {reason}" if reason else words


def doing(transition: Transition, verb: str | None) -> str:
    """What a decision does: ``migrate``, ``undo: resume``, ``clear (no action)``."""
    if verb is None:
        return f"{transition.value} (no action)"
    return f"undo: {verb}" if transition is not Transition.FIRE else verb


def summary(annotations: Mapping[str, str]) -> str:
    """The policy's own words for a decision: its rendered ``summary`` (else ``description``)."""
    return annotations.get("summary") or annotations.get("description") or ""
