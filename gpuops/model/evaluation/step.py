"""What one evaluation of a policy takes and hands back: the ``QueryResult`` the runtime got,
the ``Freshness`` bounds it derives from its configuration, and the ``Step`` (decisions, next
state, and the skipped evaluation when data was missing or stale).

Passed to ``gpuops.model.evaluation.evaluator.evaluate`` by the runtime, the backtests and the
policy tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import inf

from gpuops.model.decisions import Decision, Sample, SkippedEvaluation
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.staleness import StaleInput


@dataclass(frozen=True)
class QueryResult:
    """What the runtime got for a policy at ``now``.

    ``clear_samples`` is the result of ``clear_expr`` (None when the policy has none or when no
    target was firing); ``error`` says the query failed, which changes no timer (it only notes
    where a stretch without fresh data began). ``stale``: the input series of the queries whose
    newest sample is older than the freshness bound, per input (empty: none, or not asked:
    backtests).
    """

    samples: Sequence[Sample] = ()
    clear_samples: Sequence[Sample] | None = None
    error: str | None = None
    stale: Sequence[StaleInput] = ()


@dataclass(frozen=True)
class Freshness:
    """When data is fresh enough to act on (the runtime derives it from its configuration;
    the defaults, no bound, are those of backtests, whose data is history)."""

    max_sample_age_s: float = inf
    """An input series whose newest sample is older than this is stale: the targets it is
    attributed to have no data (nothing acted on, no timer moved); the others are judged."""
    max_gap_s: float = inf
    """A stretch of failed or stale evaluations longer than this (from the first of them to
    the next fresh one) starts the ``for`` of pending targets again: an outage does not count
    towards ``for``. Time without any evaluation (the engine restarting) is no such stretch."""


@dataclass(frozen=True)
class Step:
    decisions: tuple[Decision, ...]
    state: PolicyState
    skipped: SkippedEvaluation | None = None
