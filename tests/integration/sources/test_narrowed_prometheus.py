"""``clear_expr`` read only for the firing targets, against a real Prometheus: the
narrowed query answers exactly what the wide one answers for those targets, however hostile
their label values (quotes, backslashes, regex characters, a newline, a prefix of another
value): labels are data. And the sample-age probe reads such a selector (its matcher value
escaped: printed as it is, the probe would not be PromQL and the policy never evaluated).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpuops.sim.fleet.remotewrite import RemoteWriter
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promproc import PrometheusServer
from gpuops.sources.promql import input_selectors, narrowed
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

HOSTILE = ['a"b', "back\\slash", "dot.star*", "pipe|x", "new\nline", "GPU-1", "é(x)[y]{z}^$"]
ALL = [*HOSTILE, "GPU-10", "GPU-1x", "ab"]  # GPU-10/GPU-1x: GPU-1 as a prefix; ab: a"b less "


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    config = "global:\n  scrape_interval: 15s\nscrape_configs: []\n"
    work = tmp_path_factory.mktemp("narrowed")
    with PrometheusServer(work, config, extra_args=["--web.enable-remote-write-receiver"]) as p:
        now = time.time()
        writer = RemoteWriter(p.url)
        samples = {
            (("__name__", "util"), ("node", f"node-{i}"), ("uuid", value)): 0.1 * i
            for i, value in enumerate(ALL)
        }
        writer.add(int(now * 1000), samples)
        writer.flush()
        client = PrometheusClient(p.url)
        assert wait_for(lambda: len(client.query("util", at=now)) == len(ALL), timeout=20)
        yield p.url, now


def _by_target(samples: tuple, names: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.get(n, "") for n in names): s.value for s in samples}


def test_a_narrowed_query_answers_the_firing_targets_exactly(
    prometheus: tuple[str, float],
) -> None:
    url, now = prometheus
    client = PrometheusClient(url)
    expr = "avg_over_time(util[5m]) >= 0"
    names = ("node", "uuid")
    firing = [{"node": f"node-{i}", "uuid": v} for i, v in enumerate(ALL) if v in HOSTILE]
    query = narrowed(expr, names, firing)
    assert query is not None and "uuid=~" in query
    wide = _by_target(client.query(expr, at=now), names)
    narrow = _by_target(client.query(query, at=now), names)
    assert set(narrow) == {(t["node"], t["uuid"]) for t in firing}
    assert narrow == {k: v for k, v in wide.items() if k in narrow}


def test_a_narrowed_query_for_a_thousand_targets_is_answered(
    prometheus: tuple[str, float],
) -> None:
    """~40 kB of PromQL, sent as a POST form (a proxy refuses such a GET)."""
    url, now = prometheus
    names = ("node", "uuid")
    firing = [{"node": f"node-{i}", "uuid": v} for i, v in enumerate(ALL) if v in HOSTILE]
    firing += [{"node": f"gone-{i}", "uuid": f"GPU-{i:030d}"} for i in range(1000 - len(firing))]
    query = narrowed("util >= 0", names, firing)
    assert query is not None and len(query) > 30_000
    narrow = _by_target(PrometheusClient(url).query(query, at=now), names)
    assert set(narrow) == {(f"node-{i}", v) for i, v in enumerate(ALL) if v in HOSTILE}


def test_only_what_is_sound_is_narrowed() -> None:
    names = ("node", "uuid")
    one = [{"node": "n", "uuid": "u"}]
    for local in (
        "avg_over_time(util[2m]) > 0.5",
        "sum by (node, uuid, pool) (rate(x[5m])) > on (uuid, node) group_left y",
        "-x unless ignoring (pool) y",
        "max without (pool) (x) > 1",
    ):
        assert narrowed(local, names, one) is not None, local
    for wide in (
        "sum(x) > 1",  # every target's value depends on all series
        "x > on (node) y",  # matches across uuids
        "max without (uuid) (x)",
        'label_replace(x, "uuid", "$1", "other", "(.*)")',  # rewrites a target label
        "x > scalar(sum(y))",
        "x offset 5m",
        "absent(x)",
    ):
        assert narrowed(wide, names, one) is None, wide
    assert narrowed("x > 1", (), one) is None  # no target labels: nothing to narrow by
    assert narrowed("x > 1", names, []) is None
    many = [{"node": "n", "uuid": f"u{i}"} for i in range(2000)]
    assert narrowed("x > 1", names, many) is None  # past NARROW_MAX_TARGETS: the wide query


def test_the_age_probe_reads_a_selector_with_a_quote(prometheus: tuple[str, float]) -> None:
    url, now = prometheus
    client = PrometheusClient(url)
    inputs = input_selectors('util{uuid="a\\"b"} > 0')
    (series,) = client.stale_series(inputs, 2.0, at=now + 5)[inputs[0]]
    assert series.labels["uuid"] == 'a"b' and 4 <= series.value <= 6  # its age
    assert client.stale_series(inputs, 10.0, at=now + 5) == {}
