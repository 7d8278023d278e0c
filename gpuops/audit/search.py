"""``gpuops audit search``: find audit documents by time, user, policy, action, outcome, target
label and free text, in Elasticsearch or in the local spool, with the same results.

Called by ``gpuops.cli.audit``; ``gpuops.audit.anomalies`` uses the backends too. Both backends
return ``_source`` documents newest first (ties: ``event.id`` ascending); the spool backend
keeps the first of documents with the same ``event.id``, as the index does (later ones are 409s).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from elasticsearch import Elasticsearch

from gpuops.audit.client import CLIENT_ERRORS, wrap
from gpuops.audit.query import (
    Condition,
    Match,
    Term,
    TimeRange,
    all_of,
    get_field,
    parse_time,
    terms_buckets,
)
from gpuops.audit.spool import read_spool

Stream = Literal["decision", "audit", "all"]


def index_pattern(stream: Stream, namespace: str = "default") -> str:
    """The data streams a search covers."""
    names = ("decision", "audit") if stream == "all" else (stream,)
    return ",".join(f"logs-gpuops.{name}-{namespace}" for name in names)


def dataset_condition(stream: Stream) -> Condition | None:
    if stream == "all":
        return None
    return Term("data_stream.dataset", (f"gpuops.{stream}",))


@dataclass(frozen=True)
class SearchQuery:
    """What ``gpuops audit search`` looks for; every criterion given must hold."""

    since: float | None = None
    until: float | None = None
    user: str | None = None
    policy: str | None = None
    action: str | None = None
    outcome: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    text: str | None = None
    stream: Stream = "all"
    limit: int = 100

    def condition(self) -> Condition:
        return all_of(
            dataset_condition(self.stream),
            TimeRange("@timestamp", self.since, self.until)
            if self.since is not None or self.until is not None
            else None,
            Term("user.name", (self.user,)) if self.user else None,
            Term("rule.name", (self.policy,)) if self.policy else None,
            Term("event.action", (self.action,)) if self.action else None,
            Term("event.outcome", (self.outcome,)) if self.outcome else None,
            *(Term(f"labels.{k}", (v,)) for k, v in sorted(self.labels.items())),
            Match("message", self.text) if self.text else None,
        )


def _sort_key(doc: Mapping[str, Any]) -> tuple[float, str]:
    stamps = [parse_time(v) for v in get_field(doc, "@timestamp")]
    ts = next((s for s in stamps if s is not None), 0.0)
    ids = get_field(doc, "event.id")
    return (-round(ts * 1000), str(ids[0]) if ids else "")


@dataclass(frozen=True)
class Level:
    """One level of a nested ``terms`` grouping: the field, how many buckets, the least count."""

    field: str
    size: int
    min_count: int = 1


@dataclass(frozen=True)
class Group:
    """One leaf bucket of a grouping: its keys and counts per level, and the documents of it
    that match the ``recent`` condition (None when none was asked)."""

    keys: tuple[str, ...]
    counts: tuple[int, ...]
    recent: int | None = None


class Backend(Protocol):
    """Where audit documents are read from."""

    def search(self, query: SearchQuery) -> list[dict[str, Any]]: ...

    def group(
        self,
        condition: Condition,
        stream: Stream,
        levels: Sequence[Level],
        recent: Condition | None = None,
    ) -> list[Group]:
        """Nested terms buckets of the matching documents, count desc then key asc."""
        ...


class SpoolBackend:
    """Reads the segments of a spool directory (what ``AuditLog`` has not shipped, or
    everything when no Elasticsearch is configured)."""

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir

    def _unique(self) -> Iterator[dict[str, Any]]:
        seen: set[str] = set()
        for doc in read_spool(self.spool_dir):
            ids = get_field(doc, "event.id")
            key = str(ids[0]) if ids else ""
            if key in seen:
                continue
            seen.add(key)
            yield doc

    def search(self, query: SearchQuery) -> list[dict[str, Any]]:
        condition = query.condition()
        found = [doc for doc in self._unique() if condition.matches(doc)]
        found.sort(key=_sort_key)
        return found[: query.limit]

    def group(
        self,
        condition: Condition,
        stream: Stream,
        levels: Sequence[Level],
        recent: Condition | None = None,
    ) -> list[Group]:
        full = all_of(dataset_condition(stream), condition)
        docs = [doc for doc in self._unique() if full.matches(doc)]
        return list(_local_groups(docs, levels, (), (), recent))


def _local_groups(
    docs: Sequence[Mapping[str, Any]],
    levels: Sequence[Level],
    keys: tuple[str, ...],
    counts: tuple[int, ...],
    recent: Condition | None,
) -> Iterator[Group]:
    if not levels:
        hits = None if recent is None else sum(1 for d in docs if recent.matches(d))
        yield Group(keys, counts, hits)
        return
    level = levels[0]
    for key, inner in terms_buckets(docs, level.field, level.size, level.min_count):
        yield from _local_groups(inner, levels[1:], (*keys, key), (*counts, len(inner)), recent)


class ElasticsearchBackend:
    """Searches the gpuops data streams of an Elasticsearch cluster."""

    def __init__(self, client: Elasticsearch, namespace: str = "default") -> None:
        self.client = client
        self.namespace = namespace

    def _search(self, stream: Stream, **body: Any) -> dict[str, Any]:
        try:
            response = self.client.search(
                index=index_pattern(stream, self.namespace),
                ignore_unavailable=True,
                allow_no_indices=True,
                **body,
            )
        except CLIENT_ERRORS as exc:
            raise wrap(exc, "search") from exc
        return dict(response.body)

    def search(self, query: SearchQuery) -> list[dict[str, Any]]:
        body = self._search(
            query.stream,
            query=query.condition().to_dsl(),
            size=query.limit,
            sort=[{"@timestamp": {"order": "desc"}}, {"event.id": {"order": "asc"}}],
        )
        return [dict(hit["_source"]) for hit in body["hits"]["hits"]]

    def group(
        self,
        condition: Condition,
        stream: Stream,
        levels: Sequence[Level],
        recent: Condition | None = None,
    ) -> list[Group]:
        aggs: dict[str, Any] = {"recent": {"filter": recent.to_dsl()}} if recent else {}
        for depth in reversed(range(len(levels))):
            level = levels[depth]
            terms = {"field": level.field, "size": level.size, "min_doc_count": level.min_count}
            aggs = {f"level{depth}": {"terms": terms, **({"aggs": aggs} if aggs else {})}}
        full = all_of(dataset_condition(stream), condition)
        body = self._search(stream, query=full.to_dsl(), size=0, aggs=aggs)
        return list(_es_groups(body.get("aggregations") or {}, 0, len(levels), (), ()))


def _es_groups(
    agg: Mapping[str, Any],
    depth: int,
    total: int,
    keys: tuple[str, ...],
    counts: tuple[int, ...],
) -> Iterator[Group]:
    if depth == total:
        recent = agg.get("recent")
        yield Group(keys, counts, None if recent is None else int(recent["doc_count"]))
        return
    for bucket in agg[f"level{depth}"]["buckets"]:
        yield from _es_groups(
            bucket, depth + 1, total, (*keys, str(bucket["key"])), (*counts, bucket["doc_count"])
        )
