"""What the rules of a what-if read: the windows of their queries (each must hold two samples
at the scrape interval) and the metric names of their selectors (the only series the run
writes to Prometheus).

Used by ``gpuops.sim.whatif.runs`` (``run_on``) before the policies-on run starts.
"""

from __future__ import annotations

from collections.abc import Iterator

import promql_parser

from gpuops.model.guardrails import population_expr
from gpuops.model.rules.model import RuleSet
from gpuops.runtime import Engine
from gpuops.sim.whatif.errors import WhatifError


def windows(expr: str) -> Iterator[float]:
    """The range (seconds) of every range selector and subquery of ``expr``."""
    found: list[float] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.MatrixSelector | promql_parser.SubqueryExpr):
            if node.range is not None:
                found.append(node.range.total_seconds())
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return iter(found)


def metric_names(rules: RuleSet) -> frozenset[str] | None:
    """The metric names every query of ``rules`` can read — each policy's ``expr``,
    ``clear_expr`` and population query (``limits.population``, else
    ``gpuops.model.guardrails.population_expr``), offset selectors included — so that the run writes
    only those series. None (write every series): a selector without a metric name (``{job=
    "x"}``, ``{__name__=~"..."}``), or a population that may read any series (a policy with
    ``max_fraction`` but neither ``target`` nor ``limits.population``, or whose results' sources
    cannot be told)."""
    names: set[str] = set()
    for policy in rules.policies():
        exprs = [policy.expr, policy.clear_expr]
        if policy.max_fraction is not None:
            if policy.population is None and not policy.target:
                return None  # its population's labels are its targets': known only at run time
            exprs.append(population_expr(policy))
        for expr in exprs:
            if expr is None:
                continue
            for selector in _selectors(expr):
                name = selector.name or next(
                    (
                        m.value
                        for m in selector.matchers.matchers
                        if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
                    ),
                    None,
                )
                if not name or selector.matchers.or_matchers:
                    return None
                names.add(name)
    return frozenset(names)


def _selectors(expr: str) -> list[promql_parser.VectorSelector]:
    """Every vector selector of ``expr`` (offset and ``@`` ones too)."""
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def check_windows(engine: Engine, scrape_interval_s: float) -> None:
    """Every window the policies read must hold two samples at this scrape interval (a
    `[2m]` window scraped every 90 s would see one, or none): else the run would measure
    policies that do not work as written."""
    for group in engine.rules.groups:
        for policy in group.policies:
            for key, expr in (("expr", policy.expr), ("clear_expr", policy.clear_expr)):
                for window in windows(expr) if expr else ():
                    if window < 2 * scrape_interval_s:
                        line = policy.key_lines.get(key)
                        where = (
                            f"{policy.source.rsplit(':', 1)[0]}:{line}" if line else policy.source
                        )
                        raise WhatifError(
                            f"{where}: policy {policy.name}, {key}: reads a {window:g} s "
                            f"window, which holds fewer than two samples at a scrape interval "
                            f"of {scrape_interval_s:g} s: use a scrape interval of at most "
                            f"{window / 2:g} s"
                        )
