"""The remote-write encoder against a reference decoder: Google's protobuf runtime, with
prompb's messages declared from their definition, decodes what ``RemoteWriter`` sends and
finds every series, label, value (bit for bit) and timestamp that went in."""

from __future__ import annotations

import random
import struct

import cramjam
import pytest
import responses
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from gpuops.sim.fleet.remotewrite import STALE_NAN, Labels, RemoteWriter

_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_T = descriptor_pb2.FieldDescriptorProto


def _write_request_class() -> type[Message]:
    """``prometheus.WriteRequest`` as prompb/remote.proto and types.proto define it
    (github.com/prometheus/prometheus, Apache-2.0; the fields the receiver reads)::

        message WriteRequest { repeated TimeSeries timeseries = 1; }
        message TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; }
        message Label { string name = 1; string value = 2; }
        message Sample { double value = 1; int64 timestamp = 2; }
    """
    f = descriptor_pb2.FileDescriptorProto(name="prompb_test.proto", package="prometheus")
    f.syntax = "proto3"

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for field_name, number, label, kind, type_name in fields:
            field = m.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                field.type_name = type_name

    message("WriteRequest", ("timeseries", 1, _REPEATED, _T.TYPE_MESSAGE, ".prometheus.TimeSeries"))
    message(
        "TimeSeries",
        ("labels", 1, _REPEATED, _T.TYPE_MESSAGE, ".prometheus.Label"),
        ("samples", 2, _REPEATED, _T.TYPE_MESSAGE, ".prometheus.Sample"),
    )
    message(
        "Label",
        ("name", 1, _OPTIONAL, _T.TYPE_STRING, ""),
        ("value", 2, _OPTIONAL, _T.TYPE_STRING, ""),
    )
    message(
        "Sample",
        ("value", 1, _OPTIONAL, _T.TYPE_DOUBLE, ""),
        ("timestamp", 2, _OPTIONAL, _T.TYPE_INT64, ""),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


WriteRequest = _write_request_class()

Decoded = list[tuple[Labels, list[tuple[bytes, int]]]]


def decode(body: bytes) -> Decoded:
    """(labels in the order sent, [(value's 8 bytes, timestamp ms)]) per TimeSeries."""
    request = WriteRequest()
    request.ParseFromString(body)
    return [
        (
            tuple((label.name, label.value) for label in ts.labels),
            [(struct.pack("<d", s.value), s.timestamp) for s in ts.samples],
        )
        for ts in request.timeseries  # type: ignore[attr-defined]
    ]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _scrapes(seed: int) -> list[tuple[int, dict[Labels, float]]]:
    """Scrapes of series that come and go, with labels of every length and alphabet and
    values a double can hold; timestamps from 1 ms to the 2020s (the varint's width
    changes)."""
    rng = random.Random(seed)
    alphabet = "abcxyz_09é漢\u2603 \"'{}=,\n"
    names = [f"metric_{i}" for i in range(5)]
    series = [
        tuple(
            sorted(
                {
                    "__name__": rng.choice(names),
                    "uuid": f"GPU-{i}",
                    **{
                        f"l{j}": "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
                        for j in range(rng.randrange(0, 4))
                    },
                }.items()
            )
        )
        for i in range(60)
    ]
    specials = [0.0, -0.0, 1.0, -1.5, 1e308, 5e-324, float("inf"), float("-inf"), 2.0**53]
    scrapes = []
    for n, ts in enumerate([1, 127, 128, 16_384, 1_700_000_000_000, 1_700_000_030_000]):
        live = [s for s in series if rng.random() < 0.7 or n == 0]
        scrapes.append(
            (ts, {s: rng.choice(specials) if rng.random() < 0.3 else rng.random() for s in live})
        )
    return scrapes


def _expected(
    scrapes: list[tuple[int, dict[Labels, float]]],
) -> dict[Labels, list[tuple[bytes, int]]]:
    """Per series, its samples in time order, a staleness marker where it disappeared."""
    out: dict[Labels, list[tuple[bytes, int]]] = {}
    before: set[Labels] = set()
    for ts, samples in scrapes:
        for gone in before - samples.keys():
            out.setdefault(gone, []).append((_bits(STALE_NAN), ts))
        for key, value in samples.items():
            out.setdefault(key, []).append((_bits(value), ts))
        before = set(samples)
    return out


def _by_series(decoded: Decoded) -> dict[Labels, list[tuple[bytes, int]]]:
    out: dict[Labels, list[tuple[bytes, int]]] = {}
    for labels, samples in decoded:
        assert list(labels) == sorted(labels), "labels must be sorted by name"
        out.setdefault(labels, []).extend(samples)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_what_the_writer_buffers_decodes_to_what_went_in(seed: int) -> None:
    scrapes = _scrapes(seed)
    writer = RemoteWriter("http://127.0.0.1:9")
    for ts, samples in scrapes:
        writer.add(ts, samples)
    decoded = decode(writer.request_body())
    assert _by_series(decoded) == _expected(scrapes)
    assert all(len(samples) == 1 for _, samples in decoded)  # one Sample per TimeSeries


@responses.activate
def test_what_is_posted_is_snappy_of_that_request_with_prometheus_headers() -> None:
    scrapes = _scrapes(4)
    responses.post("http://prom.test/api/v1/write", status=204)
    writer = RemoteWriter("http://prom.test")
    for ts, samples in scrapes[:3]:
        writer.add(ts, samples)
    sent = writer.flush()
    for ts, samples in scrapes[3:]:
        writer.add(ts, samples)
    sent += writer.flush()
    bodies = [bytes(cramjam.snappy.decompress_raw(c.request.body)) for c in responses.calls]
    assert len(bodies) == 2
    assert _by_series([s for body in bodies for s in decode(body)]) == _expected(scrapes)
    assert sent == writer.samples_sent == sum(len(v) for v in _expected(scrapes).values())
    headers = responses.calls[0].request.headers
    assert headers["Content-Encoding"] == "snappy"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert writer.request_body() == b""  # nothing left once sent


def test_values_and_series_must_pair_up() -> None:
    writer = RemoteWriter("http://127.0.0.1:9")
    a = writer.series.id((("__name__", "a"),))
    with pytest.raises(ValueError, match="2 series but 1 values"):
        writer.add_ids(1000, [a, a], [1.0])
