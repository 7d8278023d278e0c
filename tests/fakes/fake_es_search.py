"""Mappings, queries and aggregations of the fake Elasticsearch (``fake_elasticsearch``).

An independent, small implementation of the parts of the query DSL that gpuops uses (and a few
neighbours): ``match_all``, ``term``, ``terms``, ``range``, ``exists``, ``match``,
``match_phrase``, ``bool``, a ``query_string`` subset; ``terms``, ``filter``, ``cardinality``,
``min``/``max`` aggregations. Unmapped string fields follow Elasticsearch's dynamic mapping
(``text`` with a ``.keyword`` sub-field), so a query on a field the templates forgot to map
behaves as it would on a real cluster. Unsupported parts answer 400, never a silent guess.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

TEXT_TYPES = frozenset({"text", "match_only_text"})
NUMERIC = frozenset({"long", "integer", "short", "byte", "double", "float", "scaled_float"})
_TOKEN = re.compile(r"\w+(?:[.:'’]\w+)*")
_DATE_LIKE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ][\d:.]+)?(Z|[+-]\d{2}:?\d{2})?$")


class DslError(Exception):
    """A query or aggregation the fake (or Elasticsearch) refuses: answered as HTTP 400."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def analyze(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def parse_date(value: Any) -> float | None:
    """Epoch milliseconds of an ISO string, epoch milliseconds, or ``now[-+]N[smhd]``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"now(?:([-+])(\d+)([smhd]))?", value)
    if m:
        now = time.time() * 1000
        if not m.group(1):
            return now
        step = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(3)] * 1000 * int(m.group(2))
        return now - step if m.group(1) == "-" else now + step
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000
    except ValueError:
        return None


def values_of(doc: Mapping[str, Any], path: str) -> list[Any]:
    """Leaf values of a dotted path; documents may nest objects or use dotted keys."""
    out: list[Any] = []

    def walk(node: Any, rest: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, rest)
            return
        if not rest:
            if node is not None:
                out.append(node)
            return
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            if rest == key:
                walk(value, "")
            elif rest.startswith(key + "."):
                walk(value, rest[len(key) + 1 :])

    walk(doc, path)
    return [v for v in out if not isinstance(v, Mapping)]


_MISS = object()
_BY_VALUE = object()  # not mapped: Elasticsearch's default dynamic mapping of the value decides


class Mapping_:
    """The mapping of one data stream or index: explicit properties, dynamic templates, and
    Elasticsearch's default dynamic mapping for everything else."""

    def __init__(self, mappings: Mapping[str, Any]) -> None:
        self._memo: dict[tuple[str, type], object] = {}
        self.dynamic = mappings.get("dynamic", True)
        self.fields: dict[str, dict[str, Any]] = {}
        self._flatten(mappings.get("properties") or {}, "")
        self.dynamic_templates: list[tuple[str, bool, str, dict[str, Any]]] = []
        for entry in mappings.get("dynamic_templates") or []:
            for _name, spec in entry.items():
                by_path = "path_match" in spec
                pattern = spec.get("path_match") or spec.get("match") or "*"
                kind = spec.get("match_mapping_type", "*")
                self.dynamic_templates.append(
                    (pattern, by_path, kind, dict(spec.get("mapping") or {}))
                )

    def _flatten(self, props: Mapping[str, Any], prefix: str) -> None:
        for name, spec in props.items():
            path = prefix + name
            if "properties" in spec and spec.get("type", "object") == "object":
                self.fields[path] = {"type": "object"}
                self._flatten(spec["properties"], path + ".")
            else:
                self.fields[path] = dict(spec)

    def field_type(self, path: str, sample: Any = None) -> str | None:
        """The mapped type of ``path`` (``sample``: a value, for dynamic mapping). Memoized by
        path and the sample's Python type: a bulk of thousands of documents asks the same few
        dozen paths (the answer depends on nothing else, except the final by-value guess)."""
        key = (path, type(sample))
        found = self._memo.get(key, _MISS)
        if found is _MISS:
            found = self._mapped_type(path, sample)
            self._memo[key] = found
        if found is _BY_VALUE:
            # ``dynamic: strict``: an unmapped field has no type (and is refused), it is not
            # typed by its value
            return None if self.dynamic == "strict" else self._dynamic_type(sample)
        return found  # type: ignore[return-value]

    def by_value(self, path: str, kind: type) -> bool:
        """Whether ``path``'s type, for a value of Python type ``kind``, is not mapped but
        guessed from each value (Elasticsearch's default dynamic mapping)."""
        key = (path, kind)
        if key not in self._memo:
            self.field_type(path, kind())
        return self._memo[key] is _BY_VALUE

    def _mapped_type(self, path: str, sample: Any) -> object:
        if path in self.fields:
            return str(self.fields[path].get("type", "object"))
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            parent = ".".join(parts[:i])
            spec = self.fields.get(parent)
            if spec and spec.get("type") == "flattened":
                return "keyword"
            if spec and spec.get("type") in TEXT_TYPES and parts[i:] == ["keyword"]:
                return "keyword"
            if spec and "fields" in spec and parts[i] in spec["fields"] and i == len(parts) - 1:
                return str(spec["fields"][parts[i]].get("type", "keyword"))
        for pattern, by_path, json_kind, mapping in self.dynamic_templates:
            name = path if by_path else parts[-1]
            if json_kind == "string" and not isinstance(sample, str):
                continue
            if fnmatch.fnmatchcase(name, pattern) and "type" in mapping:
                return str(mapping["type"])
        if path.endswith(".keyword"):
            base = path[: -len(".keyword")]
            return "keyword" if base not in self.fields else None
        return _BY_VALUE

    @staticmethod
    def _dynamic_type(sample: Any) -> str | None:
        """Elasticsearch's default dynamic mapping of a value."""
        if sample is None:
            return None
        if isinstance(sample, bool):
            return "boolean"
        if isinstance(sample, int):
            return "long"
        if isinstance(sample, float):
            return "float"
        if isinstance(sample, str):
            return "date" if _DATE_LIKE.match(sample) else "text"
        return "object"


def check_value(kind: str, value: Any, spec: Mapping[str, Any]) -> str | None:
    """Why ``value`` cannot be indexed as ``kind`` (None when it can)."""
    if value is None or (not isinstance(value, str | int | float) and isinstance(value, Mapping)):
        return None
    if kind in ("long", "integer", "short", "byte"):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and re.fullmatch(r"-?\d+", value) is not None
        )
        return None if ok else f"failed to parse field of type [{kind}]: [{value}]"
    if kind in NUMERIC:
        try:
            float(value)
            return None
        except (TypeError, ValueError):
            return f"failed to parse field of type [{kind}]: [{value}]"
    if kind == "date":
        return None if parse_date(value) is not None else f"failed to parse date field [{value}]"
    if kind == "ip":
        try:
            ipaddress.ip_address(str(value))
            return None
        except ValueError:
            return f"'{value}' is not an IP string literal."
    if kind == "boolean":
        ok = isinstance(value, bool) or value in ("true", "false")
        return (
            None
            if ok
            else f"Failed to parse value [{value}] as only [true] or [false] are allowed."
        )
    if kind == "constant_keyword" and "value" in spec and value != spec["value"]:
        expected = spec["value"]
        return f"[constant_keyword] field can only have a single value [{expected}], got [{value}]"
    return None


Doc = tuple[Mapping[str, Any], Mapping_]
"""A stored document with the mapping of the stream it lives in."""


def _keyword(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _field_values(doc: Doc, path: str) -> tuple[str | None, list[Any]]:
    source, mapping = doc
    base = path[: -len(".keyword")] if path.endswith(".keyword") else path
    values = values_of(source, base)
    kind = mapping.field_type(path, values[0] if values else None)
    return kind, values


def matcher(query: Mapping[str, Any]) -> Callable[[Doc], bool]:
    """A predicate for one query clause."""
    if len(query) != 1:
        raise DslError("parsing_exception", f"query malformed, expected one clause: {query}")
    ((kind, body),) = query.items()
    if kind == "match_all":
        return lambda doc: True
    if kind == "bool":
        return _bool(body)
    if kind == "exists":
        return lambda doc: bool(_field_values(doc, body["field"])[1])
    if kind == "query_string":
        return _query_string(body)
    if not isinstance(body, Mapping) or len(body) != 1:
        raise DslError("parsing_exception", f"[{kind}] query malformed: {body}")
    ((path, arg),) = body.items()
    if kind in ("term", "terms"):
        wanted = [arg.get("value") if isinstance(arg, Mapping) else arg] if kind == "term" else arg
        return lambda doc: _term(doc, path, list(wanted))
    if kind == "range":
        return lambda doc: _range(doc, path, arg)
    if kind in ("match", "match_phrase"):
        text = arg.get("query") if isinstance(arg, Mapping) else arg
        operator = arg.get("operator", "or") if isinstance(arg, Mapping) else "or"
        return lambda doc: _match(doc, path, str(text), kind == "match_phrase", operator)
    raise DslError("parsing_exception", f"unknown query [{kind}] (the fake does not implement it)")


def _bool(body: Mapping[str, Any]) -> Callable[[Doc], bool]:
    def clauses(name: str) -> list[Callable[[Doc], bool]]:
        raw = body.get(name) or []
        return [matcher(c) for c in (raw if isinstance(raw, list) else [raw])]

    must, filt, should, must_not = (clauses(n) for n in ("must", "filter", "should", "must_not"))
    default_min = 0 if (must or filt) else 1
    minimum = int(body.get("minimum_should_match", default_min if should else 0))

    def test(doc: Doc) -> bool:
        if not all(m(doc) for m in must + filt) or any(m(doc) for m in must_not):
            return False
        return sum(1 for m in should if m(doc)) >= minimum

    return test


def _term(doc: Doc, path: str, wanted: list[Any]) -> bool:
    kind, values = _field_values(doc, path)
    if kind in TEXT_TYPES:
        have = {t for v in values for t in analyze(str(v))}
        return any(str(w) in have for w in wanted)
    if kind == "date":
        stamps = {parse_date(v) for v in values}
        return any(parse_date(w) in stamps for w in wanted)
    if kind in NUMERIC:
        return any(float(v) == float(w) for v in values for w in wanted)
    return any(_keyword(v) == _keyword(w) for v in values for w in wanted)


def _range(doc: Doc, path: str, bounds: Mapping[str, Any]) -> bool:
    kind, values = _field_values(doc, path)
    convert: Callable[[Any], Any]
    if kind == "date":
        convert = parse_date
    elif kind in NUMERIC:
        convert = float
    else:
        convert = _keyword
    for raw in values:
        value: Any = convert(raw)
        if value is None:
            continue
        checks = {"gte": value.__ge__, "gt": value.__gt__, "lte": value.__le__, "lt": value.__lt__}
        if all(checks[op](convert(b)) for op, b in bounds.items() if op in checks):
            return True
    return False


def _match(doc: Doc, path: str, text: str, phrase: bool, operator: str) -> bool:
    kind, values = _field_values(doc, path)
    if kind not in TEXT_TYPES:
        return any(_keyword(v) == text for v in values)
    wanted = analyze(text)
    for value in values:
        have = analyze(str(value))
        if phrase:
            if any(have[i : i + len(wanted)] == wanted for i in range(len(have) - len(wanted) + 1)):
                return True
        elif operator == "and" and set(wanted) <= set(have):
            return True
        elif operator != "and" and set(wanted) & set(have):
            return True
    return False


def _query_string(body: Mapping[str, Any]) -> Callable[[Doc], bool]:
    """``field:value`` and bare words, joined by ``default_operator`` (OR) or explicit AND/OR."""
    words = [w for w in str(body["query"]).split() if w not in ("AND", "OR")]
    operator = "and" if " AND " in str(body["query"]) else body.get("default_operator", "or")
    default = body.get("default_field", "message")
    parts: list[Callable[[Doc], bool]] = []
    for word in words:
        field, _, value = word.rpartition(":") if ":" in word else (default, "", word)
        parts.append(matcher({"match": {field: value.strip('"')}}))
    if str(operator).lower() == "and":
        return lambda doc: all(p(doc) for p in parts)
    return lambda doc: any(p(doc) for p in parts)


def aggregate(aggs: Mapping[str, Any], docs: list[Doc]) -> dict[str, Any]:
    """Run the aggregations of a search over the matching documents."""
    out: dict[str, Any] = {}
    for name, spec in aggs.items():
        sub = spec.get("aggs") or spec.get("aggregations") or {}
        kinds = [k for k in spec if k not in ("aggs", "aggregations", "meta")]
        if len(kinds) != 1:
            raise DslError("parsing_exception", f"aggregation [{name}] needs exactly one type")
        kind = kinds[0]
        body = spec[kind]
        if kind == "filter":
            test = matcher(body)
            inner = [d for d in docs if test(d)]
            out[name] = {"doc_count": len(inner), **aggregate(sub, inner)}
        elif kind == "terms":
            out[name] = _terms(body, sub, docs)
        elif kind == "cardinality":
            seen = {_keyword(v) for d in docs for v in _field_values(d, body["field"])[1]}
            out[name] = {"value": len(seen)}
        elif kind in ("min", "max"):
            nums = [float(v) for d in docs for v in _field_values(d, body["field"])[1]]
            out[name] = {"value": (min if kind == "min" else max)(nums) if nums else None}
        else:
            raise DslError("parsing_exception", f"unknown aggregation type [{kind}] (fake)")
    return out


def _terms(body: Mapping[str, Any], sub: Mapping[str, Any], docs: list[Doc]) -> dict[str, Any]:
    field = body["field"]
    groups: dict[Any, list[Doc]] = {}
    for doc in docs:
        kind, values = _field_values(doc, field)
        if kind in TEXT_TYPES:
            raise DslError(
                "illegal_argument_exception",
                f"Text fields are not optimised for operations that require per-document field "
                f"data like aggregations and sorting, so these operations are disabled by "
                f"default. Please use a keyword field instead. [{field}]",
            )
        keys = {v if kind in NUMERIC else _keyword(v) for v in values}
        for key in keys:
            groups.setdefault(key, []).append(doc)
    if "order" in body and body["order"] not in ({"_count": "desc"}, [{"_count": "desc"}]):
        raise DslError("parsing_exception", "the fake supports only the default terms order")
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ordered = [kv for kv in ordered if len(kv[1]) >= int(body.get("min_doc_count", 1))]
    size = int(body.get("size", 10))
    buckets = [
        {"key": key, "doc_count": len(inner), **aggregate(sub, inner)}
        for key, inner in ordered[:size]
    ]
    return {
        "doc_count_error_upper_bound": 0,
        "sum_other_doc_count": sum(len(v) for _, v in ordered[size:]),
        "buckets": buckets,
    }


def sort_key(spec: list[Any]) -> Callable[[Doc], tuple[Any, ...]]:
    """A key function for the ``sort`` of a search (missing values last)."""
    fields: list[tuple[str, bool]] = []
    for item in spec:
        if isinstance(item, str):
            fields.append((item, False))
        else:
            ((name, how),) = item.items()
            order = how.get("order", "asc") if isinstance(how, Mapping) else how
            fields.append((name, order == "desc"))

    def key(doc: Doc) -> tuple[Any, ...]:
        parts: list[Any] = []
        for name, desc in fields:
            kind, values = _field_values(doc, name)
            if kind in TEXT_TYPES:
                raise DslError("illegal_argument_exception", f"Text fields ... sorting [{name}]")
            if not values:
                parts.append((1, 0))
                continue
            value: Any = parse_date(values[0]) if kind == "date" else values[0]
            if isinstance(value, int | float) and not isinstance(value, bool):
                parts.append((0, -value if desc else value))
            else:
                text = _keyword(value)
                parts.append((0, _Reverse(text) if desc else text))
        return tuple(parts)

    return key


class _Reverse:
    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Reverse) -> bool:
        return self.text > other.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reverse) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)
