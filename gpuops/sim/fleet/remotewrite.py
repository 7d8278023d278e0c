"""Prometheus remote write (protocol 1.0): timestamped samples into a Prometheus that runs
with ``--web.enable-remote-write-receiver``, so a simulated fleet can fill it in virtual time.

Used by ``gpuops.sim.fleet.virtual`` (the what-if's fleet side). The body is a protobuf
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
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, repeat

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


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_labels(labels: Labels) -> bytes:
    """The ``labels`` fields of a TimeSeries, sorted by name (encoded once per series)."""
    return b"".join(
        _field(1, _field(1, name.encode()) + _field(2, value.encode()))
        for name, value in sorted(labels)
    )


_DOUBLE = struct.Struct("<d")


def encode_sample(value: float, timestamp_ms: int) -> bytes:
    """One ``samples`` field of a TimeSeries: Sample{value, timestamp}."""
    return _field(2, b"\x09" + _DOUBLE.pack(value) + b"\x10" + _varint(timestamp_ms))


def encode_write_request(series: Iterable[tuple[bytes, list[tuple[float, int]]]]) -> bytes:
    """A WriteRequest from (encoded labels, [(value, timestamp ms), ...]) pairs (the general
    form; ``RemoteWriter`` writes one-sample series through ``_Scrapes``, same bytes)."""
    return b"".join(
        _field(1, labels + b"".join(encode_sample(v, ts) for v, ts in samples))
        for labels, samples in series
    )


class SeriesTable:
    """Series by number: each series' labels hashed once (a tuple of label pairs is hashed
    anew at every dict lookup: per sample, that would be a scrape's largest cost at 500 GPUs)
    and encoded once."""

    def __init__(self) -> None:
        self.labels: list[Labels] = []
        """Labels of series ``i``."""
        self.encoded: list[bytes] = []
        """``encode_labels`` of series ``i``."""
        self._ids: dict[Labels, int] = {}

    def id(self, labels: Labels) -> int:
        """The number of the series with ``labels`` (a new one the first time)."""
        found = self._ids.get(labels)
        if found is None:
            found = self._ids[labels] = len(self.labels)
            self.labels.append(labels)
            self.encoded.append(encode_labels(labels))
        return found


class _Scrapes:
    """Encodes whole scrapes fast: each series as a TimeSeries with one Sample, whose bytes
    are ``prefix + stamp + double``. ``prefix`` (the TimeSeries tag and length, its labels,
    the Sample's tag and length) is built once per series and timestamp width; ``stamp``
    (the Sample's timestamp field, then its value's tag: protobuf fields may come in any
    order) once per scrape; only the value is packed per sample. A series repeated in one
    request (once per scrape) is what remote write allows: Prometheus appends in request
    order."""

    def __init__(self, series: SeriesTable) -> None:
        self.series = series
        self._prefixes: dict[int, list[bytes]] = {}

    def encode(self, timestamp_ms: int, ids: Sequence[int], values: Sequence[float]) -> bytes:
        stamp = b"\x10" + _varint(timestamp_ms) + b"\x09"
        prefixes = self._prefixes.setdefault(len(stamp), [])
        if len(prefixes) < len(self.series.encoded):
            sample_len = _varint(len(stamp) + 8)
            for labels in self.series.encoded[len(prefixes) :]:
                body_len = len(labels) + 1 + len(sample_len) + len(stamp) + 8
                prefixes.append(b"\x0a" + _varint(body_len) + labels + b"\x12" + sample_len)
        if len(ids) != len(values):
            raise ValueError(f"{len(ids)} series but {len(values)} values")
        parts = zip(map(prefixes.__getitem__, ids), repeat(stamp), map(_DOUBLE.pack, values))
        return b"".join(chain.from_iterable(parts))  # iterated in C: no Python per sample


class RemoteWriter:
    """Buffers scrapes (encoded as they come) and sends them in order to
    ``{url}/api/v1/write``, one request per ``flush``."""

    def __init__(
        self, url: str, timeout_s: float = 30.0, series: SeriesTable | None = None
    ) -> None:
        self.endpoint = url.rstrip("/") + "/api/v1/write"
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.series = series or SeriesTable()
        self._scrapes = _Scrapes(self.series)
        self._pending: list[bytes] = []
        self._pending_samples = 0
        self._live: Sequence[int] = ()
        self.samples_sent = 0
        self.bytes_sent = 0
        self.encode_s = 0.0
        """CPU seconds (this thread) spent encoding and compressing."""
        self.send_s = 0.0
        """Wall seconds spent in requests: sending, and Prometheus' ingest until it answered."""

    def add(self, timestamp_ms: int, samples: Mapping[Labels, float]) -> None:
        """One scrape's worth of samples at ``timestamp_ms``; series present before and gone
        now get a staleness marker."""
        series_id = self.series.id
        self.add_ids(timestamp_ms, [series_id(k) for k in samples], list(samples.values()))

    def add_ids(self, timestamp_ms: int, ids: Sequence[int], values: Sequence[float]) -> None:
        """``add`` by series number (``self.series``): ``values[i]`` of series ``ids[i]``,
        each series once."""
        started = time.thread_time()
        if ids != self._live:
            gone = set(self._live).difference(ids)
            if gone:
                stale = self._scrapes.encode(timestamp_ms, list(gone), [STALE_NAN] * len(gone))
                self._pending.append(stale)
                self._pending_samples += len(gone)
        self._pending.append(self._scrapes.encode(timestamp_ms, ids, values))
        self._pending_samples += len(ids)
        self._live = ids
        self.encode_s += time.thread_time() - started

    def request_body(self) -> bytes:
        """The WriteRequest of what is buffered (uncompressed)."""
        return b"".join(self._pending)

    def flush(self) -> int:
        """Send what is buffered; returns the samples sent."""
        if not self._pending:
            return 0
        started = time.thread_time()
        body = bytes(cramjam.snappy.compress_raw(self.request_body()))
        self.encode_s += time.thread_time() - started
        sending = time.perf_counter()
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
        finally:
            self.send_s += time.perf_counter() - sending
        if resp.status_code >= 300:
            raise RemoteWriteError(
                f"remote write to {self.endpoint}: {resp.status_code} {resp.text[:256]}"
            )
        count = self._pending_samples
        self._pending.clear()
        self._pending_samples = 0
        self.samples_sent += count
        self.bytes_sent += len(body)
        return count
