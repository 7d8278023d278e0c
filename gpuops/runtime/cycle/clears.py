"""The ``clear_expr`` a policy's evaluation asks: narrowed to its firing targets where that is
sound (``gpuops.sources.promql.narrowed``), made again only when those targets changed.

A steady evaluation keeps ``PolicyState.base``, so the same text of up to 40 kB is not escaped
and printed again every evaluation. Used by ``gpuops.runtime.cycle.cycle.Cycle``; the answers
are asked by ``gpuops.runtime.cycle.queries``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.rules.model import Policy
from gpuops.sources.promql import NARROW_MAX_TARGETS, narrowed


@dataclass(frozen=True)
class _Made:
    """A policy's clear query and what it was made from: the state's targets (compared by
    identity), its ``clear_expr`` and target labels."""

    base: Mapping[str, TargetState]
    expr: str
    target: tuple[str, ...] | None
    query: str | None


class ClearQueries:
    """The clear query of each policy, kept while its firing targets do not change."""

    def __init__(self) -> None:
        self._made: dict[str, _Made] = {}
        self._lock = threading.Lock()

    def __contains__(self, policy: str) -> bool:
        """Whether a query is kept for the policy named ``policy``."""
        return policy in self._made

    def query(self, policy: Policy, state: PolicyState) -> str | None:
        """``policy``'s ``clear_expr`` for its firing targets in ``state`` (None: no target
        fires, or the policy has none); call holding the policy's lock."""
        expr = policy.clear_expr
        if expr is None:
            return None
        known = self._made.get(policy.name)
        if (
            known is not None
            and known.base is state.base
            and (known.expr, known.target) == (expr, policy.target)
        ):
            return known.query
        query = narrowed_clear(expr, policy.target or (), state)
        self._made[policy.name] = _Made(state.base, expr, policy.target, query)
        return query

    def keep(self, policies: Iterable[str]) -> None:
        """The rules now hold ``policies`` (names): the queries of the others go."""
        kept = set(policies)
        with self._lock:
            for name in [n for n in self._made if n not in kept]:
                self._made.pop(name, None)


def narrowed_clear(expr: str, names: Sequence[str], state: PolicyState) -> str | None:
    """``expr`` narrowed to the firing targets of ``state`` (``narrowed``), ``expr`` itself
    where it cannot be, None when none fires. Where the first ``2 * NARROW_MAX_TARGETS + 1``
    firing targets already hold more values of one label than ``narrowed`` narrows to, its
    answer is known (None: the wide query) without reading the other targets' labels: with
    churn the base changes every evaluation, and reading every firing target of every policy
    with a ``clear_expr`` would cost a sixth of an evaluation's CPU where thousands fire."""
    firing = (t.labels for t in state.base.values() if t.status is not Status.PENDING)
    head = list(islice(firing, 2 * NARROW_MAX_TARGETS + 1))
    if not head:
        return None
    if len(head) > NARROW_MAX_TARGETS:
        for name in names:
            if name != "__name__" and len({t.get(name, "") for t in head}) > NARROW_MAX_TARGETS:
                return expr
    head.extend(firing)
    return narrowed(expr, names, head) or expr
