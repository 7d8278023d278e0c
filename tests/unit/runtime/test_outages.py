"""``OutOfService``: the nodes out of service on fresh data only — a failed query, a stale
input series or an answer without nodes is ``OutagesUnknown`` with the reason, never an empty
count; one answer serves the repairs that start within a few seconds."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest

from gpuops.model.decisions import Sample, freeze
from gpuops.runtime.outages import REUSE_S, OutagesUnknown, OutOfService
from gpuops.sources import QueryError
from tests.builders import Clock
from tests.fakes.prometheus import FakeSource

EXPR = "max by (node, rack) (node_out)"


class Source(FakeSource):
    def __init__(self, *series: tuple[dict[str, str], float]) -> None:
        self.series = list(series)
        self.stale: tuple[Sample, ...] = ()
        self.error: str | None = None
        self.asked = 0

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        assert expr == EXPR
        self.asked += 1
        if self.error is not None:
            raise QueryError(self.error)
        return tuple(Sample(freeze(labels), value, at or 0.0) for labels, value in self.series)

    def stale_series(
        self, inputs: Iterable[str], bound_s: float, at: float | None = None
    ) -> dict[str, tuple[Sample, ...]]:
        assert (list(inputs), bound_s) == (["node_out{}"], 60.0)
        return {"node_out{}": self.stale} if self.stale else {}


def reader(source: Source, clock: Clock) -> OutOfService:
    return OutOfService(source, EXPR, max_sample_age=60.0, clock=clock)


def test_each_node_with_its_labels_and_whether_it_is_out() -> None:
    source = Source(
        ({"node": "n1", "rack": "r1"}, 1.0),
        ({"node": "n2", "rack": "r1"}, 0.0),
        ({"rack": "r1"}, 1.0),  # no node: not a node
        ({"node": "n3", "rack": "r2"}, math.nan),
    )
    nodes = reader(source, Clock()).nodes()
    assert [(dict(labels), out) for labels, out in nodes] == [
        ({"node": "n1", "rack": "r1"}, True),
        ({"node": "n2", "rack": "r1"}, False),
    ]


def test_an_answer_serves_a_few_seconds_then_it_is_asked_again() -> None:
    source, clock = Source(({"node": "n1"}, 0.0)), Clock()
    out = reader(source, clock)
    out.nodes()
    clock.advance(REUSE_S - 0.1)
    out.nodes()
    assert source.asked == 1
    clock.advance(0.1)
    source.series = [({"node": "n1"}, 1.0)]
    assert [down for _, down in out.nodes()] == [True]
    assert source.asked == 2


def test_what_cannot_be_told_says_why_and_is_never_a_count() -> None:
    source, clock = Source(), Clock()
    with pytest.raises(OutagesUnknown, match=r"^its answer has no node \(a series with a node"):
        reader(source, clock).nodes()
    source.series = [({"node": "n1"}, 0.0)]
    source.error = "connection refused"
    with pytest.raises(OutagesUnknown, match="^the query failed: connection refused$"):
        reader(source, clock).nodes()
    source.error = None
    source.stale = (Sample(freeze({"node": "n1", "gpuops_input": "0"}), 0.0, 0.0),)
    with pytest.raises(OutagesUnknown) as caught:
        reader(source, clock).nodes()
    assert str(caught.value) == "1 series of node_out{} older than 60s ({node='n1'})"
