"""The audit benchmark's "duplicated" can fail: the fake tallies every write per ``_id`` (201,
409, overwrite) and per ``event.id``, and ``bench_audit.count`` finds a document stored twice
(ids read back from the fake's dict would be unique by construction)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from tests.benchmarks.bench_audit import count
from tests.fakes.fake_elasticsearch import FakeElasticsearch

INDEX = "bench-decisions"  # a plain index (no data stream): op ``index`` may overwrite


@pytest.fixture(scope="module")
def es() -> Iterator[FakeElasticsearch]:
    with FakeElasticsearch() as fake:
        fake.keep_sources = False  # as in the benchmark
        fake.tally_field = "event.id"
        yield fake


def bulk(es: FakeElasticsearch, index: str, *writes: tuple[str, str, str]) -> list[int]:
    """(op, _id, event.id) writes in one bulk; their statuses."""
    body = b"".join(
        json.dumps({op: {"_index": index, "_id": doc_id}}).encode()
        + b"\n"
        + json.dumps({"@timestamp": "2025-01-01T00:00:00Z", "event": {"id": event}}).encode()
        + b"\n"
        for op, doc_id, event in writes
    )
    request = urllib.request.Request(
        es.url + "/_bulk", body, {"Content-Type": "application/x-ndjson"}
    )
    with urllib.request.urlopen(request) as response:
        items = json.loads(response.read())["items"]
    return [next(iter(item.values()))["status"] for item in items]


def test_resends_answered_409_are_counted_apart_and_are_no_duplicates(
    es: FakeElasticsearch,
) -> None:
    index = INDEX + "-resent"
    assert bulk(es, index, ("create", "e1", "e1"), ("create", "e2", "e2")) == [201, 201]
    assert bulk(es, index, ("create", "e1", "e1"), ("create", "e1", "e1")) == [409, 409]
    counted = count(es.write_tally(index), ["e1", "e2", "e3"])
    assert counted["duplicated"] == 0
    assert counted["resends"] == 2 and counted["resent_ids"] == 1
    assert counted["lost"] == 1  # e3 was acknowledged and never stored
    assert counted["stored"] == 2 and counted["unacknowledged"] == 0


def test_an_overwrite_of_a_stored_id_is_a_duplicate(es: FakeElasticsearch) -> None:
    index = INDEX + "-overwritten"
    # one _id written 9 times: 6 creates answered 409, 3 overwrites
    for _ in range(3):
        bulk(es, index, ("create", "e1", "e1"), ("create", "e1", "e1"), ("index", "e1", "e1"))
    tally = es.write_tally(index)
    assert tally["ids"] == ["e1"]  # what the old count read: one id, so "0 duplicated"
    assert tally["stored_more_than_once"] == {"e1": 4}  # one 201 and three overwrites
    counted = count(tally, ["e1"])
    assert counted["duplicated"] == 1 and counted["extra_copies"] == 3
    assert counted["resends"] == 5 and counted["lost"] == 0


def test_one_event_id_under_two_ids_is_a_duplicate(es: FakeElasticsearch) -> None:
    index = INDEX + "-two-ids"
    assert bulk(es, index, ("create", "a", "e1"), ("create", "b", "e1")) == [201, 201]
    tally = es.write_tally(index)
    assert tally["stored_more_than_once"] == {}  # each _id once...
    counted = count(tally, ["e1"])
    assert counted["duplicated"] == 1 and counted["extra_copies"] == 1  # ...the event twice
    assert counted["lost"] == 0
