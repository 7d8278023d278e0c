"""What a query reads the present with: its input selectors and how it joins their series.

Pure PromQL analysis (parsed with ``promql-parser``, never by hand), called by
``gpuops.runtime`` and ``gpuops.offline.backtest`` for each policy's queries: the inputs are
what the stale-series probe asks about (``gpuops.sources.promql.probe``), the join labels
tie a stale series to its targets (``gpuops.model.staleness``). An input is PromQL text: an
instant selector as itself, a windowed one as ``selector[window]`` (``windowed``,
``split_input``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import promql_parser

from gpuops.sources.errors import QueryError, capped
from gpuops.sources.promql.text import selector_text

LOOKBACK_S = 300.0
"""Prometheus' default ``--query.lookback-delta``: how far back an instant selector inside a
subquery reads at each of the subquery's steps (``input_selectors``)."""


@lru_cache(maxsize=1024)
def input_selectors(expr: str) -> tuple[str, ...]:
    """The distinct inputs ``expr`` reads the present with (as PromQL text): an instant
    selector as itself; a selector read over a window (a range selector, or any selector
    inside a subquery) as ``selector[window]``, the window being how far back a sample it
    reads may lie: the range, plus every enclosing subquery's range, plus ``LOOKBACK_S`` for
    an instant selector inside a subquery. Selectors with ``offset`` or ``@`` (or inside a
    subquery that has one) read the past on purpose and are left out."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError as exc:
        raise QueryError(f"cannot tell how old the data of {expr!r} is: {capped(exc)}") from exc
    inputs: dict[str, None] = {}
    _collect_inputs(tree, 0.0, inputs)
    return tuple(inputs)


def _collect_inputs(node: Any, reach: float, inputs: dict[str, None]) -> None:
    """Add the inputs of ``node`` to ``inputs``; ``reach``: the ranges of the subqueries
    around it (0: none)."""
    pp = promql_parser
    if isinstance(node, pp.VectorSelector):
        if node.offset is None and node.at is None:
            text = selector_text(node)
            inputs[text if not reach else windowed(text, reach + LOOKBACK_S)] = None
    elif isinstance(node, pp.MatrixSelector):
        inner = node.vector_selector
        if inner.offset is None and inner.at is None:
            window = reach + node.range.total_seconds()
            inputs[windowed(selector_text(inner), window)] = None
    elif isinstance(node, pp.SubqueryExpr):
        if node.range is None:  # promql-parser's type allows it; PromQL does not
            raise QueryError(f"a subquery without a range: {node}")
        if node.offset is None and node.at is None:
            _collect_inputs(node.expr, reach + node.range.total_seconds(), inputs)
    elif isinstance(node, pp.BinaryExpr):
        _collect_inputs(node.lhs, reach, inputs)
        _collect_inputs(node.rhs, reach, inputs)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _collect_inputs(arg, reach, inputs)
    elif isinstance(node, pp.AggregateExpr):
        _collect_inputs(node.expr, reach, inputs)
        if node.param is not None:
            _collect_inputs(node.param, reach, inputs)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        _collect_inputs(node.expr, reach, inputs)


@lru_cache(maxsize=1024)
def join_labels(exprs: tuple[str, ...]) -> tuple[frozenset[str] | None, frozenset[str]]:
    """How the series of ``exprs`` are joined to their result: the labels of every
    ``on (...)`` of their binary operations (None: there is none) and of every
    ``ignoring (...)``. A stale series is attributed to the targets that share its values of
    those labels (``gpuops.model.staleness``): joined ``on (uuid)``, a series of another job
    still belongs to its GPU's target."""
    on: set[str] | None = None
    ignoring: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        nonlocal on
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                if matching.type == promql_parser.LabelModifierType.Include:
                    on = (on or set()) | set(matching.labels)
                else:
                    ignoring.update(matching.labels)
        return True

    for expr in exprs:
        try:
            promql_parser.walk(promql_parser.parse(expr), visit)
        except ValueError as exc:
            raise QueryError(f"cannot tell how {expr!r} joins its series: {capped(exc)}") from exc
    return (frozenset(on) if on is not None else None), frozenset(ignoring)


def windowed(selector: str, window_s: float) -> str:
    """The input ``selector`` read over the last ``window_s`` seconds: ``selector[window]``."""
    return f"{selector}[{_duration(window_s)}]"


def _duration(seconds: float) -> str:
    """``seconds`` as a PromQL duration (whole milliseconds when not whole seconds; at least
    one: Prometheus refuses a range of 0)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def split_input(text: str) -> tuple[str, float | None]:
    """An ``input_selectors`` input as (selector, window in seconds; None: instant). A
    selector's text ends with ``}``; a window is the last ``[...]``."""
    if not text.endswith("]"):
        return text, None
    selector, _, window = text[:-1].rpartition("[")
    ms = window[:-2] if window.endswith("ms") else None
    return selector, int(ms) / 1000 if ms is not None else float(window[:-1])
