"""PromQL analysis, pure (``promql-parser``, no HTTP): what the engine needs to know about a
query before and around asking it. ``text`` (selectors and literals written back as PromQL),
``inputs`` (the selectors a query reads the present with, the labels it joins on), ``probe``
(the one query for the input series whose newest sample is too old) and ``narrowing`` (a query
restricted to the targets it is asked about). Raises ``gpuops.sources.errors.QueryError`` for
a query it cannot read."""

from gpuops.sources.promql.inputs import LOOKBACK_S, input_selectors, join_labels, split_input
from gpuops.sources.promql.narrowing import NARROW_MAX_TARGETS, narrowed
from gpuops.sources.promql.probe import AGE_LABEL, NAME_LABEL, stale_expr
from gpuops.sources.promql.text import regex_literal, selector_text, string_literal

__all__ = [
    "AGE_LABEL",
    "LOOKBACK_S",
    "NAME_LABEL",
    "NARROW_MAX_TARGETS",
    "input_selectors",
    "join_labels",
    "narrowed",
    "regex_literal",
    "selector_text",
    "split_input",
    "stale_expr",
    "string_literal",
]
