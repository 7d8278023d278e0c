"""Filter conditions that run both as Elasticsearch query DSL and over spooled documents.

``gpuops.audit.search`` and ``gpuops.audit.anomalies`` build their filters from these, so that
``gpuops audit`` gives the same answers against Elasticsearch and against the local spool.
Text matching follows Elasticsearch's standard analyzer closely enough for audit messages:
lower-cased word tokens, where ``.``, ``:`` and ``'`` between word characters do not split.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gpuops.audit.documents import iso

_TOKEN = re.compile(r"\w+(?:[.:'’]\w+)*")


def tokens(text: str) -> list[str]:
    """The tokens Elasticsearch's standard analyzer makes of ``text`` (approximately)."""
    return _TOKEN.findall(text.lower())


def get_field(doc: Mapping[str, Any], path: str) -> list[Any]:
    """The values of a dotted field in a nested document (arrays flattened; [] when absent)."""
    values: list[Any] = [doc]
    for part in path.split("."):
        found: list[Any] = []
        for value in values:
            if isinstance(value, Mapping) and part in value:
                inner = value[part]
                found.extend(inner if isinstance(inner, list) else [inner])
        values = found
    return [v for v in values if v is not None]


def parse_time(value: Any) -> float | None:
    """Epoch seconds of an ISO 8601 string or a number of epoch milliseconds (date fields)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) / 1000.0
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


class Condition(Protocol):
    def to_dsl(self) -> dict[str, Any]: ...

    def matches(self, doc: Mapping[str, Any]) -> bool: ...


@dataclass(frozen=True)
class Term:
    """A keyword field equals one of ``values``."""

    field: str
    values: tuple[str, ...]

    def to_dsl(self) -> dict[str, Any]:
        if len(self.values) == 1:
            return {"term": {self.field: self.values[0]}}
        return {"terms": {self.field: list(self.values)}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return any(str(v) in self.values for v in get_field(doc, self.field))


@dataclass(frozen=True)
class TimeRange:
    """A date field within [since, until] (epoch seconds; None: open)."""

    field: str
    since: float | None
    until: float | None

    def to_dsl(self) -> dict[str, Any]:
        bounds: dict[str, Any] = {"format": "strict_date_optional_time"}
        if self.since is not None:
            bounds["gte"] = iso(self.since)
        if self.until is not None:
            bounds["lte"] = iso(self.until)
        return {"range": {self.field: bounds}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        for value in get_field(doc, self.field):
            ts = parse_time(value)
            if ts is None:
                continue
            ms = round(ts * 1000)
            if self.since is not None and ms < round(self.since * 1000):
                continue
            if self.until is not None and ms > round(self.until * 1000):
                continue
            return True
        return False


@dataclass(frozen=True)
class Exists:
    field: str

    def to_dsl(self) -> dict[str, Any]:
        return {"exists": {"field": self.field}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return bool(get_field(doc, self.field))


@dataclass(frozen=True)
class Match:
    """Every token of ``text`` is in the text field (``match`` with operator ``and``)."""

    field: str
    text: str

    def to_dsl(self) -> dict[str, Any]:
        return {"match": {self.field: {"query": self.text, "operator": "and"}}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        wanted = set(tokens(self.text))
        return any(wanted <= set(tokens(str(v))) for v in get_field(doc, self.field))


@dataclass(frozen=True)
class Phrase:
    """The tokens of ``phrase`` appear in this order in the text field (``match_phrase``)."""

    field: str
    phrase: str

    def to_dsl(self) -> dict[str, Any]:
        return {"match_phrase": {self.field: self.phrase}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        wanted = tokens(self.phrase)
        for value in get_field(doc, self.field):
            have = tokens(str(value))
            if any(have[i : i + len(wanted)] == wanted for i in range(len(have))):
                return True
        return False


@dataclass(frozen=True)
class AllOf:
    conditions: tuple[Condition, ...]

    def to_dsl(self) -> dict[str, Any]:
        if not self.conditions:
            return {"match_all": {}}
        return {"bool": {"filter": [c.to_dsl() for c in self.conditions]}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return all(c.matches(doc) for c in self.conditions)


@dataclass(frozen=True)
class AnyOf:
    conditions: tuple[Condition, ...]

    def to_dsl(self) -> dict[str, Any]:
        return {
            "bool": {"should": [c.to_dsl() for c in self.conditions], "minimum_should_match": 1}
        }

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return any(c.matches(doc) for c in self.conditions)


@dataclass(frozen=True)
class Not:
    condition: Condition

    def to_dsl(self) -> dict[str, Any]:
        return {"bool": {"must_not": [self.condition.to_dsl()]}}

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return not self.condition.matches(doc)


def all_of(*conditions: Condition | None) -> AllOf:
    """The conjunction of the conditions that are not None."""
    return AllOf(tuple(c for c in conditions if c is not None))


def terms_buckets(
    docs: Sequence[Mapping[str, Any]], field: str, size: int, min_doc_count: int = 1
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """A ``terms`` aggregation over documents: (key, documents), by count desc then key asc."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for doc in docs:
        for key in {str(v) for v in get_field(doc, field)}:
            groups.setdefault(key, []).append(doc)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [(k, v) for k, v in ordered if len(v) >= min_doc_count][:size]
