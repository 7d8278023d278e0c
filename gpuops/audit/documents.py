"""ECS 9.x documents for decisions, outcomes, skipped evaluations and user operations.

Pure functions called by ``gpuops.audit.log.AuditLog``; every field is an ECS field of
``ecs_flat_9.4.0.yml`` (with an allowed value where ECS lists them) or lives under ``gpuops.*``.
``tests/unit/audit/test_documents.py`` checks that against the reference file.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpuops.model.decisions import Decision, Outcome, OutcomeStatus, SkippedEvaluation, Verdict
from gpuops.model.telling import effect, state

ECS_VERSION = "9.4.0"
_EXECUTE = Verdict.EXECUTE.value
DECISION_DATASET = "gpuops.decision"
AUDIT_DATASET = "gpuops.audit"

_LOGIN_ACTIONS = frozenset({"login", "authenticate", "authentication", "token"})
_READ_PREFIXES = ("get", "list", "query", "read", "search", "explain", "show", "export")
_AUTH_ERRORS = ("401", "403", "unauthorized", "unauthorised", "forbidden", "token")


@functools.lru_cache(maxsize=4096)
def iso(ts: float) -> str:
    """An epoch timestamp as ISO 8601 with milliseconds in UTC (what ``date`` fields take).

    Cached: a cycle's decisions share their evaluation time, episode starts and ``now``, so
    most calls repeat a recent timestamp (formatting one costs ~1.5 us)."""
    return (
        datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


_FAST_ISO_END = 253402300000.0
"""Below this (9999-12-31T23:46:40Z) and from 0 up, ``iso_json`` formats by itself; other times
go through ``datetime`` (which raises for years past 9999, as ``iso`` does)."""
_ISO_JSON: dict[float, bytes] = {}
_MINUTES: dict[int, bytes] = {}


def iso_json(ts: float) -> bytes:
    """``iso(ts)`` as a JSON string (quoted, UTF-8), byte for byte, without ``datetime``.

    Each target's episode start is a time of its own, so a cache of the times seen misses
    (formatting one through ``datetime`` costs ~3-5 us on a loaded core): this splits the
    time as ``datetime.fromtimestamp`` does (microseconds rounded half to even, then cut to
    milliseconds by ``isoformat``) and fills the seconds and milliseconds into the text of its
    minute, made once per minute. ``tests/unit/audit/test_iso_json.py`` compares it with
    ``iso`` on the edges (rounding ties, carries into the next second, minute, day and year)
    and 200,000 random times. The times a cycle's decisions share are cached as they are."""
    cached = _ISO_JSON.get(ts)
    if cached is not None:
        return cached
    if not 0.0 <= ts < _FAST_ISO_END:  # also NaN: datetime's own error, or text, as iso
        return b'"' + iso(ts).encode() + b'"'
    frac, whole = math.modf(ts)
    micros = round(frac * 1e6)  # what fromtimestamp does (_PyTime_ROUND_HALF_EVEN)
    seconds = int(whole)
    if micros >= 1_000_000:
        seconds += 1
        micros -= 1_000_000
    minute, second = divmod(seconds, 60)
    text = _MINUTES.get(minute)
    if text is None:
        if len(_MINUTES) >= 65_536:
            _MINUTES.clear()
        start = datetime.fromtimestamp(minute * 60, tz=UTC)
        text = _MINUTES[minute] = start.strftime('"%Y-%m-%dT%H:%M:').encode() + b'%02d.%03dZ"'
    data = text % (second, micros // 1000)
    if len(_ISO_JSON) >= 16_384:
        _ISO_JSON.clear()
    _ISO_JSON[ts] = data
    return data


def event_id(*parts: str) -> str:
    """A deterministic document id: the same parts give the same id (a retry is a 409)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _plain(value: Any) -> Any:
    """A JSON-safe copy of an executor's params or changes (mappings, sequences, scalars)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _base(dataset: str, namespace: str, at: float, now: float) -> dict[str, Any]:
    return {
        "@timestamp": iso(at),
        "ecs": {"version": ECS_VERSION},
        "data_stream": {"type": "logs", "dataset": dataset, "namespace": namespace},
        "event": {"kind": "event", "dataset": dataset, "module": "gpuops", "created": iso(now)},
    }


_SCALARS = (str, int, bool, type(None))


def _plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``_plain(params)`` with a fast path for the usual flat mapping of plain scalars."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, _SCALARS) or (isinstance(value, float) and math.isfinite(value)):
            out[str(key)] = value
        else:
            return _plain(params)  # type: ignore[no-any-return]
    return out


def outcome_fields(verdict: str, outcome: Outcome | None) -> tuple[str, str, bool]:
    """A decision document's outcome status (``none`` without one), ECS ``event.outcome`` and
    whether the action ran (``event.type`` change)."""
    if outcome is None:
        return "none", "unknown", False
    outcome_status = outcome.status
    if verdict == _EXECUTE:
        if outcome_status is OutcomeStatus.SUCCESS:
            return outcome_status._value_, "success", True
        if outcome_status is OutcomeStatus.FAILURE:
            return outcome_status._value_, "failure", True
    return outcome_status._value_, "unknown", False


def outcome_told(decision: Decision, outcome: Outcome) -> tuple[str, str]:
    """An outcome in words for ``gpuops.outcome``: where the decision stands (``done``,
    ``no effect`` for an action that ran and changed nothing its verb promises — a migrate
    that moved no job, a scale-in that powered nothing down —, ``failed``, ``held``) and what
    its action changed (empty when it did not succeed: ``error.message`` says why).
    ``event.outcome`` stays ECS's ``success``, ``failure`` or ``unknown``."""
    verb = decision.action.type if decision.action is not None else None
    told = effect(verb, outcome.changed)
    stands = state(
        Verdict(decision.verdict),
        has_action=decision.action is not None,
        started=False,
        outcome=outcome,
        verb=verb,
    )
    return stands.value, told.text if outcome.ok else ""


def decision_message(
    decision: Decision,
    labels: Mapping[str, str],
    transition: str,
    verdict: str,
    status: str,
    outcome: Outcome | None,
) -> str:
    """A decision document's ``message``: policy, transition, target, verdict, outcome."""
    target = ", ".join(map("=".join, sorted(labels.items())))
    message = f"{decision.policy} {transition} on {target or decision.target.key}: {verdict}"
    if decision.reason:
        message += f" ({decision.reason})"
    if outcome is not None:
        message += f", {status}"
        if outcome.error:
            message += f": {outcome.error}"
    return message


def decision_document(
    decision: Decision, outcome: Outcome | None, host_name: str, namespace: str, now: float
) -> dict[str, Any]:
    """The document of one decision (``outcome`` None when it was not executed).

    Built in one pass, every value computed once (timestamps through the ``iso`` cache): the
    cycle writes one per decision, so this is on the audit's hot path. The fields and values
    are exactly those of the plain field-by-field construction that
    ``tests/unit/audit/reference_documents`` keeps as the reference (a test compares them)."""
    verdict = decision.verdict
    transition = decision.transition.value
    spec = decision.action
    reason = decision.reason
    status, ecs_outcome, executed = outcome_fields(verdict, outcome)
    labels = {str(k): str(v) for k, v in decision.target.labels.items()}
    event: dict[str, Any] = {
        "kind": "event",
        "dataset": DECISION_DATASET,
        "module": "gpuops",
        "created": iso(now),
        "id": event_id(decision.id, verdict, status),
        "category": ["host"],
        "type": ["change"] if executed else ["info"],
        "action": spec.type if spec is not None else transition,
        "outcome": ecs_outcome,
    }
    if reason:
        event["reason"] = reason
    if outcome is not None and math.isfinite(outcome.duration_s):
        event["duration"] = int(round(outcome.duration_s * 1e9))
    message = decision_message(decision, labels, transition, verdict, status, outcome)
    evidence = decision.evidence
    value = evidence.value
    gpuops_evidence: dict[str, Any] = {
        "expr": evidence.expr,
        "value": value if value is not None and math.isfinite(value) else None,
        "observed_at": iso(evidence.observed_at),
    }
    if evidence.pending_since is not None:
        gpuops_evidence["pending_since"] = iso(evidence.pending_since)
    decision_part: dict[str, Any] = {
        "id": decision.id,
        "episode_start": iso(decision.episode_start),
        "repeat": decision.repeat,
    }
    if decision.held_repeats:  # the suppression before this record, decided again unrecorded
        decision_part["held_repeats"] = decision.held_repeats
    gpuops: dict[str, Any] = {
        "decision": decision_part,
        "verdict": verdict,
        "reason": reason,
        "transition": transition,
        "mode": decision.mode,
        "target": {"key": decision.target.key, "labels": dict(labels)},
        "evidence": gpuops_evidence,
    }
    if decision.labels:
        gpuops["policy"] = {"labels": {str(k): str(v) for k, v in decision.labels.items()}}
    if spec is not None:
        gpuops["executor"] = spec.executor
        gpuops["action"] = {"type": spec.type, "params": _plain_params(spec.params)}
    doc: dict[str, Any] = {
        "@timestamp": iso(decision.at),
        "ecs": {"version": ECS_VERSION},
        "data_stream": {"type": "logs", "dataset": DECISION_DATASET, "namespace": namespace},
        "event": event,
        "message": message,
        "rule": {"name": decision.policy, "ruleset": decision.group},
        "host": {"name": host_name},
        "labels": labels,
    }
    if outcome is not None:
        gpuops["outcome"] = {
            "status": status,
            "attempts": outcome.attempts,
            "changed": _plain(outcome.changed),
        }
        stands, told = outcome_told(decision, outcome)
        gpuops["outcome"]["state"] = stands
        if told:
            gpuops["outcome"]["effect"] = told
        if outcome.error:
            doc["error"] = {"message": outcome.error}
    doc["gpuops"] = gpuops
    return doc


def skipped_document(
    skipped: SkippedEvaluation, host_name: str, namespace: str, now: float
) -> dict[str, Any]:
    """The document of an evaluation that did not happen (its query failed, or its stored state
    could not be read: ``skipped.reason``)."""
    doc = _base(DECISION_DATASET, namespace, skipped.at, now)
    doc["event"].update(
        {
            "id": event_id(skipped.policy, skipped.group, f"{skipped.at:.6f}", "skipped"),
            "category": ["database"],
            "type": ["error"],
            "action": "skipped_evaluation",
            "outcome": "unknown",
            "reason": skipped.reason,
        }
    )
    doc["message"] = f"{skipped.policy} evaluation skipped: {skipped.reason}: {skipped.error}"
    doc["rule"] = {"name": skipped.policy, "ruleset": skipped.group}
    doc["host"] = {"name": host_name}
    doc["error"] = {"message": skipped.error}
    doc["gpuops"] = {"verdict": "skipped", "reason": skipped.reason}
    return doc


def operation_document(
    *,
    user: str,
    roles: Sequence[str],
    action: str,
    outcome: str,
    source_ip: str | None,
    message: str,
    details: Mapping[str, Any] | None,
    error: str | None,
    host_name: str,
    namespace: str,
    now: float,
) -> dict[str, Any]:
    """The document of one user operation (API call, CLI operation, failed login)."""
    ecs_outcome = outcome if outcome in ("success", "failure", "unknown") else "unknown"
    doc = _base(AUDIT_DATASET, namespace, now, now)
    verb = action.lower()
    if verb in _LOGIN_ACTIONS:
        category, types = "authentication", ["start"]
    else:
        category = "api"
        types = ["access"] if verb.startswith(_READ_PREFIXES) else ["change"]
        lowered = (error or "").lower()
        if ecs_outcome == "failure" and any(word in lowered for word in _AUTH_ERRORS):
            types.append("denied")
    doc["event"].update(
        {
            "id": uuid.uuid4().hex,
            "category": [category],
            "type": types,
            "action": action,
            "outcome": ecs_outcome,
        }
    )
    doc["message"] = message
    doc["user"] = {"name": user, "roles": list(roles)}
    doc["host"] = {"name": host_name}
    if source_ip:
        doc["source"] = {"address": source_ip}
        if _is_ip(source_ip):
            doc["source"]["ip"] = source_ip
    if error:
        doc["error"] = {"message": error}
    gpuops: dict[str, Any] = {"operation": {"outcome": outcome}}
    if details:
        gpuops["operation"]["details"] = _plain(details)
    doc["gpuops"] = gpuops
    return doc


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def stream_of(doc: Mapping[str, Any]) -> str:
    """The data stream of a document, by the data stream naming scheme: type-dataset-namespace."""
    ds = doc.get("data_stream") or {}
    kind, dataset = ds.get("type", "logs"), ds.get("dataset", AUDIT_DATASET)
    return f"{kind}-{dataset}-{ds.get('namespace', 'default')}"


def leadership_document(
    elected: bool,
    replica: str,
    epoch: int,
    reason: str,
    at: float,
    host_name: str,
    namespace: str,
    now: float,
) -> dict[str, Any]:
    """The document of a leadership change of engine replica ``replica`` (docs/ha.md): it
    became the leader with lease epoch ``epoch``, or stopped leading (``reason``)."""
    doc = _base(AUDIT_DATASET, namespace, at, now)
    change = "elected" if elected else "demoted"
    doc["event"].update(
        {
            "id": event_id("leadership", replica, str(epoch), change),
            "category": ["configuration"],
            "type": ["change"],
            "action": f"leadership.{change}",
            "outcome": "success",
        }
    )
    verb = "became the leader" if elected else "stopped leading"
    doc["message"] = f"engine replica {replica} {verb} (lease epoch {epoch}): {reason}"
    doc["host"] = {"name": host_name}
    doc["gpuops"] = {"leadership": {"replica": replica, "epoch": epoch, "change": change}}
    return doc


def clock_step_document(
    step_s: float, at: float, host_name: str, namespace: str, now: float
) -> dict[str, Any]:
    """The document of a wall-clock step the engine's scheduler detected at ``at`` (the new
    wall time): ``step_s`` seconds, negative when the clock went back (docs/policies.md,
    "Clock")."""
    doc = _base(AUDIT_DATASET, namespace, at, now)
    direction = "forward" if step_s > 0 else "backward"
    doc["event"].update(
        {
            "id": event_id("clock-step", host_name, f"{at:.6f}", f"{step_s:.6f}"),
            "category": ["host"],
            "type": ["change"],
            "action": "clock_step",
            "outcome": "unknown",
        }
    )
    doc["message"] = (
        f"wall clock stepped {direction} by {abs(step_s):.1f} s: group grids and cron "
        "schedules re-anchored to the new wall time"
    )
    doc["host"] = {"name": host_name}
    doc["gpuops"] = {"clock": {"step_seconds": step_s, "direction": direction}}
    return doc
