"""Which targets of a policy rest on stale input series (pure).

Called by ``gpuops.model.evaluation.stale.around_stale`` with the stale series the runtime found
(``gpuops.sources.prometheus.stale_series``: per input of the policy's queries, the series whose
newest sample is older than the freshness bound). A target is held (no timer moves, nothing is
decided for it) when a stale series is attributed to it; the others are judged as usual.

A stale series is attributed to a target by identity labels: the policy's ``target:``; without
it, the labels the expression joins its series on (every ``on (...)``: a series of another job
joined ``on (uuid)`` belongs to its GPU), else the target's own labels less those of every
``ignoring (...)``. It goes to every target that has the same value for each of those labels
the series carries, and to every target when it carries none of them (an aggregation such as
``sum(x) > 10`` reads every series for its one target) (docs/policies.md, "Fresh data").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuops.model.decisions import Sample
from gpuops.model.rules.model import Policy

PROBE_LABELS = frozenset({"gpuops_input", "gpuops_name", "__name__"})
"""The labels a stale series carries from the probe (``gpuops.sources.prometheus.AGE_LABEL``,
``NAME_LABEL``) and its name: none of them ties it to a target."""


@dataclass(frozen=True)
class StaleInput:
    """The series of one input (a selector, ``selector[window]`` when read over a window)
    whose newest sample is older than the bound. Their values are ages (seconds) for an
    instant selector; for a windowed one the age is only known to exceed the bound."""

    input: str
    series: Sequence[Sample]
    joined_on: frozenset[str] | None = None
    """The labels the policy's expressions join their series on (``on (...)``), None: none
    (``gpuops.sources.prometheus.join_labels``)."""
    ignoring: frozenset[str] = frozenset()
    """The labels their joins ignore (``ignoring (...)``)."""

    @property
    def ages_known(self) -> bool:
        """Whether the series' values are their ages: an instant selector with a metric name
        (``gpuops.sources.prometheus.stale_expr``)."""
        return not self.input.endswith("]") and not self.input.startswith("{")

    def oldest(self) -> float | None:
        """The age of its oldest series, when known."""
        if not self.ages_known or not self.series:
            return None
        return max(s.value for s in self.series)


@dataclass(frozen=True)
class Held:
    """What stale input holds in one evaluation: ``every`` target, or the targets ``keys``."""

    every: bool
    keys: frozenset[str]


def held_targets(
    policy: Policy,
    stale: Sequence[StaleInput],
    targets: Iterable[tuple[str, Mapping[str, str]]],
) -> Held:
    """The targets among ``targets`` (key, identity labels) that a stale series of ``stale``
    is attributed to (see the module's docstring)."""
    series = [_labels(s) for one in stale for s in one.series]
    if not series:
        return Held(False, frozenset())
    named = policy.target
    if named:
        names = frozenset(named) - {"__name__"}
        sigs = _signatures(names, series)
        if sigs is None:
            return Held(True, frozenset())
        return Held(False, frozenset(k for k, labels in targets if _matches(labels, sigs)))
    joined_on = next((one.joined_on for one in stale if one.joined_on is not None), None)
    ignoring = frozenset().union(*(one.ignoring for one in stale))
    if joined_on is not None:
        sigs = _signatures(joined_on, series)
        if sigs is None:
            return Held(True, frozenset())
        return Held(False, frozenset(k for k, labels in targets if _matches(labels, sigs)))
    held: set[str] = set()
    by_names: dict[frozenset[str], dict[tuple[str, ...], set[tuple[str, ...]]] | None] = {}
    for key, labels in targets:
        names = frozenset(labels) - ignoring
        if names not in by_names:
            by_names[names] = _signatures(names, series)
        sigs = by_names[names]
        if sigs is None or _matches(labels, sigs):
            held.add(key)
    return Held(False, frozenset(held))


def _labels(sample: Sample) -> Mapping[str, str]:
    return {k: v for k, v in sample.labels.items() if k not in PROBE_LABELS}


def _signatures(
    names: frozenset[str], series: Iterable[Mapping[str, str]]
) -> dict[tuple[str, ...], set[tuple[str, ...]]] | None:
    """Per set of identity labels a stale series carries (sorted), the values it has for
    them; None when a series carries none (it is attributed to every target)."""
    sigs: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for labels in series:
        shared = tuple(sorted(names.intersection(labels)))
        if not shared:
            return None
        sigs.setdefault(shared, set()).add(tuple(labels[n] for n in shared))
    return sigs


def _matches(
    labels: Mapping[str, str], sigs: Mapping[tuple[str, ...], set[tuple[str, ...]]]
) -> bool:
    get = labels.get
    return any(tuple(get(n, "") for n in sig) in values for sig, values in sigs.items())


def describe(stale: Sequence[StaleInput], bound_s: float) -> str:
    """Why input is stale, in words (the skipped evaluation's error): each input and how
    many of its series are stale, and the oldest age where it is known."""
    parts = []
    for one in stale:
        count = len(one.series)
        oldest = one.oldest()
        age = f", the oldest {oldest:.1f}s old" if oldest is not None else ""
        parts.append(f"{one.input}: {count} series with no sample in the last {bound_s:g}s{age}")
    return "stale data: " + "; ".join(parts)
