"""The fake Elasticsearch keeps the wire contract the real client and real servers have."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from elastic_transport import ConnectionTimeout
from elasticsearch import ApiError, BadRequestError, ConflictError, Elasticsearch

from gpuops.audit.settings import default_templates_dir
from gpuops.audit.templates import install_templates
from tests.fakes.fake_elasticsearch import FakeElasticsearch

DOC = {"@timestamp": "2025-01-01T00:00:00Z", "event": {"id": "e1", "action": "reclaim"}}
STREAM = "logs-gpuops.decision-default"


@pytest.fixture
def es() -> Iterator[tuple[FakeElasticsearch, Elasticsearch]]:
    with FakeElasticsearch() as fake:
        client = Elasticsearch(fake.url, max_retries=0)
        install_templates(client, default_templates_dir())
        yield fake, client
        client.close()


def test_the_real_client_accepts_it_and_every_2xx_has_the_product_header(
    es: tuple[FakeElasticsearch, Elasticsearch],
) -> None:
    fake, client = es
    assert client.info()["version"]["number"].startswith("8.")
    with urllib.request.urlopen(fake.url) as response:
        assert response.headers["X-Elastic-Product"] == "Elasticsearch"


def test_duplicate_create_is_409_and_data_streams_take_only_create(
    es: tuple[FakeElasticsearch, Elasticsearch],
) -> None:
    _, client = es
    client.create(index=STREAM, id="e1", document=DOC)
    with pytest.raises(ConflictError):
        client.create(index=STREAM, id="e1", document=DOC)
    items = client.bulk(operations=[{"index": {"_index": STREAM}}, DOC])["items"]
    assert items[0]["index"]["status"] == 400
    assert "op_type of create" in items[0]["index"]["error"]["reason"]
    assert client.indices.get_data_stream(name=STREAM)["data_streams"][0]["name"] == STREAM


def test_mapped_types_are_enforced_per_item(es: tuple[FakeElasticsearch, Elasticsearch]) -> None:
    _, client = es
    bad = {**DOC, "source": {"ip": "nope"}}
    items = client.bulk(operations=[{"create": {"_index": STREAM, "_id": "x"}}, bad])["items"]
    assert items[0]["create"]["status"] == 400
    assert items[0]["create"]["error"]["type"] == "document_parsing_exception"


def test_injected_faults_and_unsupported_requests(
    es: tuple[FakeElasticsearch, Elasticsearch],
) -> None:
    fake, client = es
    client.create(index=STREAM, id="e1", document={**DOC, "message": "text"})
    fake.fail_next(503)
    with pytest.raises(ApiError) as caught:
        client.bulk(operations=[{"create": {"_index": STREAM, "_id": "y"}}, DOC])
    assert caught.value.meta.status == 503
    client = client.options()  # a fresh view; the failed node is back after its timeout
    fake.delay_s = 0.3
    with pytest.raises(ConnectionTimeout):
        client.options(request_timeout=0.05).info()
    fake.delay_s = 0.0
    with pytest.raises(BadRequestError, match="Text fields are not optimised"):
        client.search(index=STREAM, aggs={"m": {"terms": {"field": "message"}}}, size=0)
    with pytest.raises(BadRequestError, match="unknown query"):
        client.search(index=STREAM, query={"fuzzy": {"message": "x"}})


def test_search_and_aggregations(es: tuple[FakeElasticsearch, Elasticsearch]) -> None:
    _, client = es
    for n, action in enumerate(["reclaim", "reclaim", "migrate"]):
        doc = {
            **DOC,
            "event": {"id": f"s{n}", "action": action},
            "message": f"GPU out of memory {n}",
        }
        client.create(index=STREAM, id=f"s{n}", document=doc)
    body = client.search(
        index="logs-gpuops.*",
        query={"bool": {"filter": [{"match_phrase": {"message": "out of memory"}}]}},
        aggs={
            "a": {
                "terms": {"field": "event.action"},
                "aggs": {"n": {"cardinality": {"field": "event.id"}}},
            }
        },
        sort=[{"event.id": "desc"}],
        size=2,
    )
    assert [h["_id"] for h in body["hits"]["hits"]] == ["s2", "s1"]
    assert body["hits"]["total"]["value"] == 3
    buckets = [
        (b["key"], b["doc_count"], b["n"]["value"]) for b in body["aggregations"]["a"]["buckets"]
    ]
    assert buckets == [("reclaim", 2, 2), ("migrate", 1, 1)]


def test_index_templates_need_their_component_templates(tmp_path: Path) -> None:
    with FakeElasticsearch() as fake:
        request = urllib.request.Request(
            f"{fake.url}/_index_template/t",
            data=json.dumps({"index_patterns": ["x-*"], "composed_of": ["missing"]}).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request)
        caught.value.close()
        assert caught.value.code == 400


def test_a_malformed_bulk_body_is_a_400_like_the_real_one() -> None:
    with FakeElasticsearch() as es:
        headers = {"Content-Type": "application/x-ndjson"}
        resp = requests.post(f"{es.url}/_bulk", data=b"{not json\n", headers=headers, timeout=5)
        assert resp.status_code == 400
        assert resp.json()["error"]["type"] == "illegal_argument_exception"
        body = b'{"frobnicate": {"_index": "x"}}\n{}\n'
        resp = requests.post(f"{es.url}/_bulk", data=body, headers=headers, timeout=5)
        assert resp.status_code == 400 and "found [frobnicate]" in resp.text
        for meta, token in [
            (b'"x"', "VALUE_STRING"),
            (b"[]", "START_ARRAY"),
            (b"1", "VALUE_NUMBER_INT"),
        ]:
            body = b'{"create": ' + meta + b"}\n{}\n"
            resp = requests.post(f"{es.url}/_bulk", data=body, headers=headers, timeout=5)
            assert resp.status_code == 400, meta
            error = resp.json()["error"]
            assert error["type"] == "illegal_argument_exception"
            assert error["reason"].endswith(f"expected START_OBJECT but found [{token}]"), error


def test_filter_path_keeps_only_the_named_fields_of_a_bulk_answer(
    es: tuple[FakeElasticsearch, Elasticsearch],
) -> None:
    _, client = es
    ops = [{"create": {"_index": STREAM, "_id": "f1"}}, DOC]
    body = client.bulk(operations=ops * 2, filter_path="errors,items.*.status,items.*.error")
    assert body["errors"] is True
    assert body["items"][0] == {"create": {"status": 201}}
    (second,) = body["items"][1].values()
    assert second["status"] == 409
    assert set(second) == {"status", "error"}
    assert second["error"]["type"] == "version_conflict_engine_exception"
    with pytest.raises(BadRequestError, match="filter_path"):
        client.bulk(operations=ops, filter_path="-items")


def test_index_over_an_existing_id_is_an_update_with_a_new_version() -> None:
    with FakeElasticsearch() as fake:
        client = Elasticsearch(fake.url, max_retries=0)
        ops = [{"index": {"_index": "plain", "_id": "a"}}, {"n": 1}]
        first = client.bulk(operations=ops)["items"][0]["index"]
        second = client.bulk(operations=[ops[0], {"n": 2}])["items"][0]["index"]
        client.close()
        assert (first["result"], first["status"], first["_version"]) == ("created", 201, 1)
        assert (second["result"], second["status"], second["_version"]) == ("updated", 200, 2)
        assert second["_seq_no"] == first["_seq_no"] + 1
        assert fake.documents("plain") == [{"n": 2}]


def _raw_exchange(es: FakeElasticsearch, data: bytes) -> bytes:
    """``data`` sent on one connection, closed for writing; all the fake answered."""
    with socket.create_connection(("127.0.0.1", es.port), timeout=5) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := conn.recv(1 << 16):
            out += chunk
    return out


@pytest.mark.parametrize("declared", ["-1", "abc", "+5"])
def test_a_content_length_that_is_no_length_is_a_400_and_runs_nothing(declared: str) -> None:
    """A ``Content-Length`` that is no length (``-1`` would read the buffer minus one byte as
    the body, the next pipelined request's too) is refused, and nothing is indexed."""
    doc = b'{"create":{"_index":"idx","_id":"neg"}}\n{"@timestamp":"2024-01-01T00:00:00Z"}\n'
    request = (
        b"POST /_bulk HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
        b"Content-Length: " + declared.encode() + b"\r\n\r\n" + doc
    )
    with FakeElasticsearch() as es:
        answer = _raw_exchange(es, request + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert f"invalid Content-Length [{declared}]".encode() in answer
        assert answer.count(b"HTTP/1.1 ") == 1  # the connection is closed: framing is lost
        assert es.ids("idx") == []


def test_a_bulk_with_a_malformed_line_stores_none_of_its_items() -> None:
    """Elasticsearch parses the whole body before it runs any item: the items before a
    malformed line are not stored under its 400."""
    with FakeElasticsearch() as es:
        good = b'{"create":{"_index":"idx","_id":"a"}}\n{"@timestamp":"2024-01-01T00:00:00Z"}\n'
        headers = {"Content-Type": "application/x-ndjson"}
        for bad in (b"{not json\n", b'{"frobnicate":{"_index":"idx"}}\n{}\n'):
            resp = requests.post(f"{es.url}/_bulk", data=good + bad, headers=headers, timeout=5)
            assert resp.status_code == 400 and "line [3]" in resp.text
        assert es.ids("idx") == []


def test_a_malformed_source_fails_its_item_only() -> None:
    """As in Elasticsearch, a source is parsed when its item runs: the other items are stored."""
    with FakeElasticsearch() as es:
        good = b'{"create":{"_index":"idx","_id":"a"}}\n{"@timestamp":"2024-01-01T00:00:00Z"}\n'
        bad = b'{"create":{"_index":"idx","_id":"b"}}\n{"@timestamp": nope}\n'
        headers = {"Content-Type": "application/x-ndjson"}
        resp = requests.post(f"{es.url}/_bulk", data=bad + good, headers=headers, timeout=5)
        assert resp.status_code == 200
        first, second = (item["create"] for item in resp.json()["items"])
        assert (first["status"], first["_id"], second["status"]) == (400, "b", 201)
        assert first["error"]["type"] == "document_parsing_exception"
        assert es.ids("idx") == ["a"]


def test_a_strict_mapping_refuses_a_new_field_with_its_own_error_type() -> None:
    """Elasticsearch answers an item refused by ``dynamic: strict`` as
    ``strict_dynamic_mapping_exception`` naming the field and its object, and a value its
    mapped type cannot parse as ``document_parsing_exception``."""
    with FakeElasticsearch() as es:
        template = {
            "index_patterns": ["strict-*"],
            "template": {
                "mappings": {
                    "dynamic": "strict",
                    "properties": {
                        "n": {"type": "long"},
                        "obj": {"properties": {"k": {"type": "keyword"}}},
                    },
                }
            },
        }
        resp = requests.put(f"{es.url}/_index_template/strict", json=template, timeout=5)
        assert resp.status_code == 200, resp.text
        docs = [{"n": 1, "extra": 2}, {"n": 1, "obj": {"k": "v", "more": 1}}, {"n": "x"}, {"n": 2}]
        body = b"".join(
            b'{"create": {"_index": "strict-1"}}\n' + json.dumps(doc).encode() + b"\n"
            for doc in docs
        )
        headers = {"Content-Type": "application/x-ndjson"}
        resp = requests.post(f"{es.url}/_bulk", data=body, headers=headers, timeout=5)
        items = [item["create"] for item in resp.json()["items"]]
        errors = [item.get("error", {}) for item in items]
        assert [e.get("type") for e in errors] == [
            "strict_dynamic_mapping_exception",
            "strict_dynamic_mapping_exception",
            "document_parsing_exception",
            None,
        ]
        assert "dynamic introduction of [extra] within [_doc] is not allowed" in errors[0]["reason"]
        assert "dynamic introduction of [more] within [obj] is not allowed" in errors[1]["reason"]
        assert [item["status"] for item in items] == [400, 400, 400, 201]
