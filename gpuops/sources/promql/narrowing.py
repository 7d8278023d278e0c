"""Narrowing: a query rewritten to read only the series of the targets it is asked about.

Called by ``gpuops.runtime.cycle`` for a policy's ``clear_expr``, asked only while targets
fire and only for them: Prometheus then reads the series of those targets, not the fleet's.
Pure PromQL rewriting over ``promql-parser``'s tree; None wherever the rewrite would not be
sound, and the caller asks the wide query.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import promql_parser

from gpuops.sources.promql.text import regex_literal, selector_text, string_literal

NARROW_MAX_TARGETS = 1000
"""``narrowed`` restricts a query to at most this many targets' label values; past that the
wide query is cheaper than matching the values (and its text would pass 40 kB)."""

_LOCAL_FUNCTIONS = frozenset(
    {f"{agg}_over_time" for agg in ("avg", "min", "max", "sum", "count", "last", "stddev")}
    | {"stdvar_over_time", "quantile_over_time", "present_over_time", "rate", "irate"}
    | {"increase", "delta", "idelta", "deriv", "predict_linear", "changes", "resets", "abs"}
    | {"ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp"}
    | {"clamp_min", "clamp_max", "timestamp", "time", "histogram_quantile"}
)
"""Functions whose result for a series depends on that series alone (and keep its labels)."""


def narrowed(expr: str, names: Sequence[str], targets: Iterable[Mapping[str, str]]) -> str | None:
    """``expr`` read only for ``targets`` (their values of the labels ``names``): every vector
    selector gets ``name=~"v1|v2|..."`` per label (values escaped), so Prometheus reads only
    those series. Sound only when each output series of ``expr`` depends on input series with
    the same values of ``names``; ``expr`` must be made of selectors, numbers, per-series
    functions (``_LOCAL_FUNCTIONS``), aggregations ``by`` all of ``names`` (or ``without``
    none of them) and binary operators that match on all of ``names`` — else None (as when
    there are more than ``NARROW_MAX_TARGETS`` targets, or none: ask the wide query). The
    answer may hold more series than ``targets`` (every combination of the values).
    ``__name__`` is left out of ``names``: a target does not keep it (``Target.from_labels``),
    so its values would all be ``""``, which no series has."""
    names = [n for n in names if n != "__name__"]
    wanted = [dict.fromkeys(t.get(n, "") for t in targets) for n in names]
    if not names or not wanted[0] or max(len(v) for v in wanted) > NARROW_MAX_TARGETS:
        return None
    extra = [
        f"{name}=~{string_literal('|'.join(regex_literal(v) for v in values))}"
        for name, values in zip(names, wanted, strict=True)
    ]
    try:
        return _render(promql_parser.parse(expr), frozenset(names), extra)
    except (ValueError, _NotLocal):
        return None


class _NotLocal(Exception):
    """``narrowed`` cannot restrict this expression soundly."""


def _render(node: promql_parser.Expr, names: frozenset[str], extra: Sequence[str]) -> str:
    pp = promql_parser
    if isinstance(node, pp.VectorSelector):
        # ``or`` groups (MetricsQL's ``{a="1" or b="2"}``): not narrowed, the wide query
        if node.offset is not None or node.at is not None or node.matchers.or_matchers:
            raise _NotLocal
        return selector_text(node, extra)
    if isinstance(node, pp.MatrixSelector):
        inner = _render(node.vector_selector, names, extra)
        return f"{inner}[{pp.display_duration(node.range)}]"
    if isinstance(node, pp.NumberLiteral):
        value = float(node.val)
        if value != value or value in (math.inf, -math.inf):
            raise _NotLocal
        return repr(value)
    if isinstance(node, pp.ParenExpr):
        return f"({_render(node.expr, names, extra)})"
    if isinstance(node, pp.UnaryExpr):
        return f"-({_render(node.expr, names, extra)})"
    if isinstance(node, pp.Call):
        if node.func.name not in _LOCAL_FUNCTIONS:
            raise _NotLocal
        return f"{node.func.name}({', '.join(_render(a, names, extra) for a in node.args)})"
    if isinstance(node, pp.AggregateExpr):
        mod = node.modifier
        if mod is None or node.param is not None and not isinstance(node.param, pp.NumberLiteral):
            raise _NotLocal
        by = mod.type == pp.AggModifierType.By
        if (by and not names <= set(mod.labels)) or (not by and names & set(mod.labels)):
            raise _NotLocal
        clause = f"{'by' if by else 'without'} ({', '.join(mod.labels)})"
        param = f"{_render(node.param, names, extra)}, " if node.param is not None else ""
        return f"{node.op} {clause} ({param}{_render(node.expr, names, extra)})"
    if isinstance(node, pp.BinaryExpr):
        bin_mod = node.modifier
        matching = bin_mod.matching if bin_mod is not None else None
        if matching is not None:
            on = matching.type == pp.LabelModifierType.Include
            if (on and not names <= set(matching.labels)) or (
                not on and names & set(matching.labels)
            ):
                raise _NotLocal
        lhs, rhs = _render(node.lhs, names, extra), _render(node.rhs, names, extra)
        modifier = f"{bin_mod} " if bin_mod is not None and str(bin_mod) else ""
        return f"({lhs}) {node.op} {modifier}({rhs})"
    raise _NotLocal
