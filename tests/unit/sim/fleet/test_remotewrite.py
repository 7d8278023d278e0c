"""The remote-write body: protobuf bytes as prompb's WriteRequest lays them out."""

from __future__ import annotations

import math
import struct

from gpuops.sim.fleet.remotewrite import STALE_NAN, encode_labels, encode_write_request


def test_a_write_request_is_the_protobuf_of_the_spec() -> None:
    labels = encode_labels((("__name__", "x"),))
    body = encode_write_request([(labels, [(1.0, 1000)])])
    label = b"\x0a\x08__name__\x12\x01x"  # Label{name=1, value=2}
    sample = b"\x09" + struct.pack("<d", 1.0) + b"\x10\xe8\x07"  # Sample{value=1, timestamp=2}
    series = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    assert body == b"\x0a" + bytes([len(series)]) + series  # WriteRequest{timeseries=1}


def test_labels_are_sorted_and_the_stale_marker_is_prometheus_nan() -> None:
    assert encode_labels((("b", "2"), ("a", "1"))) == encode_labels((("a", "1"), ("b", "2")))
    assert math.isnan(STALE_NAN)
    assert struct.pack("<d", STALE_NAN) == struct.pack("<Q", 0x7FF0000000000002)
