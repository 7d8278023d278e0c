"""PromQL written from parsed selectors: literals escaped, matchers added.

Used by ``gpuops.sources.promql.inputs`` (the text of each input selector) and
``gpuops.sources.promql.narrowing`` (selectors with the targets' label values added). Written
here, not with promql-parser's ``str(node)``: it prints matcher values without escaping them
(``{a="q\\""}`` comes back as ``{a="q""}``) and an ``or`` selector as ``{ or a="1" or b="2"}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import promql_parser

from gpuops.sources.errors import QueryError

_MATCH_OPS = (
    (promql_parser.MatchOp.Equal, "="),
    (promql_parser.MatchOp.NotEqual, "!="),
    (promql_parser.MatchOp.Re, "=~"),
    (promql_parser.MatchOp.NotRe, "!~"),
)


def string_literal(value: str) -> str:
    """``value`` as a PromQL string literal ("labels are data": quotes, backslashes and control
    characters escaped as Go's ``strconv.Unquote``, which Prometheus uses, reads them)."""
    return json.dumps(value, ensure_ascii=False)


def regex_literal(value: str) -> str:
    """A RE2 pattern that matches exactly ``value``."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value)


def selector_text(node: promql_parser.VectorSelector, extra: Iterable[str] = ()) -> str:
    """``node`` as PromQL (its offset and ``@`` left out), with the matchers ``extra`` (PromQL
    text) added (to each ``or`` group of a selector that has them, MetricsQL's
    ``{a="1" or b="2"}``)."""
    extra = tuple(extra)
    groups = node.matchers.or_matchers or [node.matchers.matchers]
    text = " or ".join(",".join([*map(_matcher_text, group), *extra]) for group in groups)
    return f"{node.name or ''}{{{text}}}"


def _matcher_text(m: promql_parser.Matcher) -> str:
    op = next((text for kind, text in _MATCH_OPS if m.op == kind), None)
    if op is None:
        raise QueryError(f"unknown label matcher {m.op} on {m.name}")
    return f"{m.name}{op}{string_literal(m.value)}"
