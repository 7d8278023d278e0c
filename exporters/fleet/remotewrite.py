"""Prometheus remote write (protocol 1.0): timestamped samples into a Prometheus that runs
with ``--web.enable-remote-write-receiver``, so a simulated fleet can fill it in virtual time.

Used by ``exporters.fleet.virtual`` (the what-if's fleet side). The body is a protobuf
``prometheus.WriteRequest`` (``prompb/remote.proto``, ``types.proto``), snappy block-compressed
(cramjam). The four messages are encoded here by hand: generated protobuf classes would need
``protoc`` at build time for what is four fields::

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }       (sorted by name, __name__ too)
    Sample       { double value = 1; int64 timestamp = 2; }   (milliseconds)

A series that stops being reported gets Prometheus' staleness marker (``STALE_NAN``), as a
scrape would write it, so instant queries stop seeing it at once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

import cramjam
import requests

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
"""The NaN Prometheus writes when a series disappears from a scrape."""

Labels = tuple[tuple[str, str], ...]


class RemoteWriteError(Exception):
    """Prometheus refused a write (the message has its status and answer) or was unreachable."""


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_SMALL = tuple(_varint(n) for n in range(1 << 14))
"""The varints of 0..16383 (two bytes at most): the lengths of nearly every message, looked up
instead of encoded — a WriteRequest of a 500-GPU scrape has ~20,000 of them."""


def _length(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else _varint(n)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_labels(labels: Labels) -> bytes:
    """The ``labels`` fields of a TimeSeries (encode once per series, reuse per write)."""
    return b"".join(
        _field(1, _field(1, name.encode()) + _field(2, value.encode()))
        for name, value in sorted(labels)
    )


_SAMPLE = struct.Struct("<d")


def encode_sample(value: float, timestamp_ms: int) -> bytes:
    body = b"\x09" + _SAMPLE.pack(value) + b"\x10" + _varint(timestamp_ms)
    return _field(2, body)


def encode_write_request(series: Iterable[tuple[bytes, list[tuple[float, int]]]]) -> bytes:
    """A WriteRequest from (encoded labels, [(value, timestamp ms), ...]) pairs. A Sample's
    bytes around its value depend only on its timestamp: encoded once per timestamp (a request
    holds a few) instead of once per sample."""
    out = bytearray()
    around: dict[int, tuple[bytes, bytes]] = {}
    pack = _SAMPLE.pack
    for labels, samples in series:
        body = bytearray(labels)
        for value, timestamp_ms in samples:
            parts = around.get(timestamp_ms)
            if parts is None:
                stamp = b"\x10" + _varint(timestamp_ms)
                head = _varint(2 << 3 | 2) + _varint(9 + len(stamp)) + b"\x09"
                parts = around[timestamp_ms] = (head, stamp)
            body += parts[0]
            body += pack(value)
            body += parts[1]
        out += b"\x0a"  # field 1 (timeseries), length-delimited
        out += _length(len(body))
        out += body
    return bytes(out)


class RemoteWriter:
    """Buffers samples per series and sends them in order to ``{url}/api/v1/write``."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.endpoint = url.rstrip("/") + "/api/v1/write"
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self._labels: dict[Labels, bytes] = {}
        self._pending: dict[Labels, list[tuple[float, int]]] = {}
        self._live: set[Labels] = set()
        self.samples_sent = 0
        self.bytes_sent = 0

    def add(self, timestamp_ms: int, samples: Mapping[Labels, float]) -> None:
        """One scrape's worth of samples at ``timestamp_ms``; series present before and gone
        now get a staleness marker."""
        for key in self._live - samples.keys():
            self._pending.setdefault(key, []).append((STALE_NAN, timestamp_ms))
        for key, value in samples.items():
            self._pending.setdefault(key, []).append((value, timestamp_ms))
        self._live = set(samples)

    def flush(self) -> int:
        """Send what is buffered; returns the samples sent."""
        if not self._pending:
            return 0
        series = []
        count = 0
        for key, samples in self._pending.items():
            labels = self._labels.get(key)
            if labels is None:
                labels = self._labels[key] = encode_labels(key)
            series.append((labels, samples))
            count += len(samples)
        body = bytes(cramjam.snappy.compress_raw(encode_write_request(series)))
        try:
            resp = self.session.post(
                self.endpoint,
                data=body,
                headers={
                    "Content-Encoding": "snappy",
                    "Content-Type": "application/x-protobuf",
                    "X-Prometheus-Remote-Write-Version": "0.1.0",
                },
                timeout=self.timeout_s,
            )
        except requests.RequestException as exc:
            raise RemoteWriteError(f"remote write to {self.endpoint} failed: {exc}") from exc
        if resp.status_code >= 300:
            raise RemoteWriteError(
                f"remote write to {self.endpoint}: {resp.status_code} {resp.text[:256]}"
            )
        self._pending.clear()
        self.samples_sent += count
        self.bytes_sent += len(body)
        return count
