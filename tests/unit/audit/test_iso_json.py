"""``iso_json``, the audit's own timestamp formatter, gives ``iso``'s text byte for
byte: on the edges where ``datetime.fromtimestamp`` rounds (ties at half a microsecond, carries
into the next second, minute, day and year), outside its fast range, and on random times."""

from __future__ import annotations

import json
import math
import random

import pytest

from gpuops.audit import documents
from gpuops.audit.documents import iso, iso_json

EDGES = [
    0.0,
    0.0005,
    0.0004999,
    1e-7,
    5e-7,  # a tie: rounds to even (0 us)
    1.5e-6,  # a tie: 2 us
    2.5e-6,  # a tie: 2 us
    59.9999995,  # carries into the next minute
    59.9999994,
    3599.9999996,
    86399.9999995,  # into the next day
    946684799.9999999,  # into 2000
    951782399.9999996,  # 2000-02-28 -> 02-29 (a leap day)
    1_699_999_999.9994,
    1_700_000_000.0005,
    4_102_444_799.9999995,  # into 2100 (no leap day)
    253_401_999_999.9999,
    253_402_299_999.9999994,  # the end of the fast range
]
OUTSIDE = [-0.5, -1.0005, -86_400.25, 253_402_300_000.0, 253_402_300_799.0]


def reference(ts: float) -> bytes:
    return json.dumps(iso(ts)).encode()


@pytest.mark.parametrize("ts", EDGES + OUTSIDE)
def test_the_edges_are_isos_text(ts: float) -> None:
    documents._ISO_JSON.clear()
    documents._MINUTES.clear()
    assert iso_json(ts) == reference(ts)
    assert iso_json(ts) == reference(ts)  # and so is the cached text


def test_random_times_and_ties_are_isos_text() -> None:
    rnd = random.Random(15)
    times = []
    for _ in range(8_000):
        second = rnd.randrange(0, 4_000_000_000)
        times += [
            rnd.uniform(0, 4e9),
            second + rnd.randrange(0, 2_000_000) / 2e6,  # half microseconds: the ties
            second + rnd.randrange(0, 1000) / 1000,  # whole milliseconds, as engines write
            second + rnd.choice([0.9999995, 0.9999994999, 0.0000005, 0.9995, 0.999]),
            rnd.uniform(0, 253_402_300_000.0),
        ]
    wrong = [(ts, iso_json(ts), reference(ts)) for ts in times if iso_json(ts) != reference(ts)]
    assert wrong == []


@pytest.mark.parametrize("ts", [math.nan, math.inf, 1e20])
def test_what_datetime_refuses_is_refused_alike(ts: float) -> None:
    with pytest.raises((ValueError, OverflowError, OSError)) as theirs:
        iso(ts)
    with pytest.raises(theirs.type):
        iso_json(ts)
