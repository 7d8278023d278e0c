"""The plain, frozen values that flow between the engine's stages.

Produced by ``gpuops.sources.prometheus`` (Sample) and ``gpuops.model.evaluation`` (Decision),
finished by ``gpuops.model.guardrails`` (verdict) and ``gpuops.actions`` (Outcome), consumed by
``gpuops.audit``. This module imports nothing of the engine: every other module may import it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import chain, starmap
from operator import itemgetter
from sys import intern
from types import MappingProxyType
from typing import Any, overload

EMPTY: Mapping[str, Any] = MappingProxyType({})


def freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of ``mapping`` (so frozen values stay frozen all the way down)."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Sample:
    """One series of an instant PromQL result."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


class Vector(Sequence[Sample]):
    """The samples of an instant query as columns: each series' labels (the decoder's own
    dict, read-only by convention), value and timestamp. A ``Sample`` is built only when one
    is read; the evaluation's steady path reads the columns (``target_keys``, ``values``)
    and builds nothing per series. Made by ``gpuops.sources.prometheus``."""

    __slots__ = ("metrics", "values", "times", "_keys", "_index")

    def __init__(
        self, metrics: Sequence[Mapping[str, str]], values: Sequence[float], times: Sequence[float]
    ) -> None:
        self.metrics = metrics
        self.values = values
        self.times = times
        self._keys: dict[tuple[str, ...] | None, list[str] | None] = {}
        self._index: dict[tuple[str, ...] | None, Mapping[str, int] | None] = {}

    def with_columns(self, values: Sequence[float], times: Sequence[float]) -> Vector:
        """The same series (their labels, and the target keys made of them, shared: made
        once for every vector of these series) with other values and times: the same query's
        next answer when its series did not change (``gpuops.sources.prometheus``)."""
        other = Vector(self.metrics, values, times)
        other._keys = self._keys
        other._index = self._index
        return other

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> Sample: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Sample]: ...

    def __getitem__(self, index: int | slice) -> Sample | Sequence[Sample]:
        if isinstance(index, slice):
            return Vector(self.metrics[index], self.values[index], self.times[index])
        return Sample(_labels(self.metrics[index]), self.values[index], self.times[index])

    def __iter__(self) -> Iterator[Sample]:
        for labels, value, ts in zip(self.metrics, self.values, self.times, strict=True):
            yield Sample(_labels(labels), value, ts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def target_keys(self, names: tuple[str, ...] | None) -> list[str] | None:
        """Every series' target key, as ``Target.from_labels(labels, names).key`` makes it,
        in passes that run in C; None when that cannot be done safely (no ``names``, a series
        without one of them, a value that ``key_value`` would escape): ask each series.
        Remembered per ``names`` (policies sharing an answer share its keys, as do the
        vectors of ``with_columns``)."""
        known = self._keys
        if names in known:
            return known[names]
        keys = known[names] = self._target_keys(names)
        return keys

    def key_index(self, names: tuple[str, ...] | None) -> Mapping[str, int] | None:
        """Each series' position by its target key (``target_keys``), or None when those
        keys cannot be made in C or a target has several series. Remembered per ``names``
        like the keys (policies sharing an answer share it: read only)."""
        known = self._index
        if names in known:
            return known[names]
        keys = self.target_keys(names)
        index = None if keys is None else dict(zip(keys, range(len(keys)), strict=True))
        if index is not None and len(index) != len(keys or ()):
            index = None
        known[names] = index
        return index

    def _target_keys(self, names: tuple[str, ...] | None) -> list[str] | None:
        picked = sorted(set(names or ()) - {"__name__"})
        if not picked:
            return None
        template = ",".join(f"{name}={{}}" for name in picked)
        try:
            values = list(map(itemgetter(*picked), self.metrics))
            # TypeError unless every value is a string
            text = "".join(values if len(picked) == 1 else chain.from_iterable(values))
        except (KeyError, TypeError):
            return None
        if "," in text or "\\" in text:
            return None
        if len(picked) == 1:
            return list(map(template.format, values))
        return list(starmap(template.format, values))


def _labels(metric: Mapping[str, Any]) -> Mapping[str, str]:
    """A series' labels, read-only; a value that is not a string is made one (a decoder's
    ``metric`` object may hold anything)."""
    try:
        "".join(metric.values())
    except TypeError:
        return MappingProxyType({str(k): str(v) for k, v in metric.items()})
    return MappingProxyType(metric)


class Transition(StrEnum):
    """What happened to a target: it started firing, it cleared, or an alert resolved it."""

    FIRE = "fire"
    CLEAR = "clear"
    RESOLVE = "resolve"


class Suppression(StrEnum):
    """Why a decision was held back; its verdict is ``suppressed:<reason>``."""

    KILL_SWITCH = "kill_switch"
    PAUSED = "paused"
    COOLDOWN = "cooldown"
    MAX_PER_HOUR = "max_per_hour"
    MAX_FRACTION = "max_fraction"
    GLOBAL_BUDGET = "global_budget"
    APPROVAL_CANCELLED = "approval_cancelled"
    APPROVAL_EXPIRED = "approval_expired"
    DENIED = "denied"
    POLICY_REMOVED = "policy_removed"
    """Held at the gate: the decision's policy is no longer in the rule set."""
    EXPIRED = "expired"
    """Held at the gate: the decision is older than ``guardrails.action_max_age``."""
    VETO = "veto"
    """Held at the gate: the target carries a veto (``gpuops.io/do-not-touch=true``)."""
    PACED = "paced"
    """A remediation ladder's repair waits for its failure domain's pace (its width taken,
    or cooling down after a failed repair); the reason names the domain."""

    @property
    def verdict(self) -> Verdict:
        """The verdict of this suppression (``suppressed:cooldown``)."""
        return _VERDICT_OF[self]

    @classmethod
    def of(cls, verdict: str) -> Suppression | None:
        """The suppression a verdict's text names, or None (not a suppression, or unknown):
        for text from the edges (API queries); values carry ``Verdict.suppression``."""
        try:
            return Verdict(verdict).suppression
        except ValueError:
            return None


class Verdict(StrEnum):
    """What the guardrails decided: one member per verdict, suppressions with their reason.
    Travels as this enum; its text (the member's value, e.g. ``suppressed:cooldown``) is what
    audit documents, the API, the CLI and metric labels show."""

    EXECUTE = "execute"
    DRY_RUN = "dry_run"
    AWAITING_APPROVAL = "awaiting_approval"
    SUPPRESSED_KILL_SWITCH = "suppressed:kill_switch"
    SUPPRESSED_PAUSED = "suppressed:paused"
    SUPPRESSED_COOLDOWN = "suppressed:cooldown"
    SUPPRESSED_MAX_PER_HOUR = "suppressed:max_per_hour"
    SUPPRESSED_MAX_FRACTION = "suppressed:max_fraction"
    SUPPRESSED_GLOBAL_BUDGET = "suppressed:global_budget"
    SUPPRESSED_APPROVAL_CANCELLED = "suppressed:approval_cancelled"
    SUPPRESSED_APPROVAL_EXPIRED = "suppressed:approval_expired"
    SUPPRESSED_DENIED = "suppressed:denied"
    SUPPRESSED_POLICY_REMOVED = "suppressed:policy_removed"
    SUPPRESSED_EXPIRED = "suppressed:expired"
    SUPPRESSED_VETO = "suppressed:veto"
    SUPPRESSED_PACED = "suppressed:paced"

    @property
    def suppression(self) -> Suppression | None:
        """Why this verdict held the decision back (None: it did not)."""
        return _SUPPRESSION_OF.get(self)


_VERDICT_OF = {s: Verdict(f"suppressed:{s.value}") for s in Suppression}
_SUPPRESSION_OF = {v: s for s, v in _VERDICT_OF.items()}


def key_value(value: str) -> str:
    """A label value as it stands in a target key: ``\\`` and ``,`` escaped, so that two
    label sets never share a key (``a="1,b=2",b="3"`` and ``a="1",b="2,b=3"`` would). A value
    without either is unchanged, as are the keys stored before this escaping."""
    if "," in value or "\\" in value:
        return value.replace("\\", "\\\\").replace(",", "\\,")
    return value


@dataclass(frozen=True)
class Target:
    """What an action is applied to: a stable key and the labels it was built from."""

    key: str
    labels: Mapping[str, str]

    @classmethod
    def from_labels(cls, labels: Mapping[str, str], names: tuple[str, ...] | None) -> Target:
        """Build the target of a series; ``names`` picks the identifying labels (None: all).
        The key and the values are interned (``sys.intern``): the policies that share a
        target keep one copy of its strings (a GPU is a target of a dozen policies, each
        of which decoded its strings from its own answer)."""
        picked = {k: labels.get(k, "") for k in names} if names else dict(labels)
        picked.pop("__name__", None)
        picked = {k: intern(v) if type(v) is str else v for k, v in picked.items()}
        key = intern(",".join(f"{k}={key_value(picked[k])}" for k in sorted(picked)))
        return cls(key=key, labels=MappingProxyType(picked))


@dataclass(frozen=True)
class ActionSpec:
    """An action as a policy declares it: verb, executor name, parameters."""

    type: str
    executor: str
    params: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class Evidence:
    """Why a decision was taken: the query, the value seen, and since when the condition held."""

    expr: str
    value: float | None
    pending_since: float | None
    observed_at: float


@dataclass(frozen=True)
class Decision:
    """One decision of one policy about one target, with its guardrail verdict.

    ``id`` is stable: the same policy, target, episode, transition and repeat give the same id,
    so a retried or replayed decision is recognised by executors and by the audit index.
    """

    id: str
    policy: str
    group: str
    target: Target
    transition: Transition
    action: ActionSpec | None
    evidence: Evidence
    at: float
    episode_start: float
    repeat: int = 0
    """How many decisions of this target's episode came before this one (part of its id)."""
    verdict: Verdict = Verdict.EXECUTE
    reason: str = ""
    mode: str = "enforce"
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    held_repeats: int = 0
    """How many times the suppression recorded before this decision for its target was decided
    again without a record (a target held by ``max_fraction`` for an hour: 59); not part of
    the id."""

    def __post_init__(self) -> None:
        if type(self.verdict) is not Verdict:  # text from an edge (a stored or test value)
            object.__setattr__(self, "verdict", Verdict(self.verdict))

    def with_verdict(self, verdict: Verdict, reason: str) -> Decision:
        """``replace(self, verdict=verdict, reason=reason)`` without re-running
        ``__init__`` over every field (every decision of an evaluation is judged)."""
        return self.but(verdict=verdict, reason=reason)

    def but(self, **changes: Any) -> Decision:
        """``dataclasses.replace(self, **changes)``, as cheap as a copy of the fields (the
        verdict made a ``Verdict`` as ``__post_init__`` does); unknown names are refused."""
        fields = self.__dict__
        if not changes.keys() <= fields.keys():
            raise TypeError(f"not fields of Decision: {sorted(changes.keys() - fields.keys())}")
        other = object.__new__(Decision)
        copied = other.__dict__
        copied.update(fields)
        copied.update(changes)
        if type(copied["verdict"]) is not Verdict:
            copied["verdict"] = Verdict(copied["verdict"])
        return other

    @property
    def suppressed(self) -> bool:
        return self.verdict.suppression is not None


def decision_id(
    policy: str, target_key: str, episode_start: float, transition: str, repeat: int = 0
) -> str:
    """The stable id of a decision (hex, 24 characters)."""
    raw = f"{policy}\x1f{target_key}\x1f{episode_start:.3f}\x1f{transition}\x1f{repeat}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


class OutcomeStatus(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Outcome:
    """What running an action did."""

    status: OutcomeStatus
    attempts: int = 0
    duration_s: float = 0.0
    error: str | None = None
    changed: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    permanent: bool = False
    """A failure that trying again will not fix (``PermanentError``, a 4xx, a bad executor
    configuration): not retried within the episode."""

    @property
    def ok(self) -> bool:
        return self.status is OutcomeStatus.SUCCESS


@dataclass(frozen=True)
class SkippedEvaluation:
    """A policy evaluation that did not happen: its data was missing (query failed) or its
    stored state could not be read (``reason`` says which)."""

    policy: str
    group: str
    at: float
    error: str
    reason: str = "query failed"
    held: tuple[str, ...] = ()
    """The targets held when only some were (stale input of theirs); empty: the whole
    evaluation was skipped."""
