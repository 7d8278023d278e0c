"""The collector's own text exposition: byte for byte what prometheus_client's
``generate_latest`` writes for the same samples, in every fake NVML scenario and with label
values that need escaping; the label text cache is reused across scrapes and stays bounded."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from gpuops.exporters.nvml.collector import LabelText, NvmlCollector
from gpuops.exporters.nvml.events import XidWatcher
from gpuops.exporters.nvml.fake import FakeNvml
from gpuops.exporters.nvml.scenarios import SCENARIOS, healthy_h100
from gpuops.exporters.nvml.session import NvmlSession


def same_scrape_both_ways(fake: FakeNvml, xids: bool = False) -> tuple[bytes, bytes]:
    session = NvmlSession(fake)
    collector = NvmlCollector(session, XidWatcher(session) if xids else None, clock=lambda: 1.0)
    for _ in range(3):  # past the scenarios' first reads (a GPU lost after two, ...)
        collector.render()
    rows = collector._gather()
    collector._gather = lambda: rows  # type: ignore[method-assign]  # one scrape, two renderings
    registry = CollectorRegistry()
    registry.register(collector)
    return collector.render(), generate_latest(registry)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_render_writes_what_generate_latest_writes(name: str) -> None:
    ours, theirs = same_scrape_both_ways(SCENARIOS[name]())
    assert ours == theirs
    assert ours.count(b"# TYPE") >= 3


def test_label_values_are_escaped_like_prometheus_client() -> None:
    fake = healthy_h100(2)
    fake.gpus[0].name = 'H100 "SXM"\\ \nrev'
    fake.gpus[1].name = "Tesla-ü"
    ours, theirs = same_scrape_both_ways(fake)
    assert ours == theirs
    assert b'name="H100 \\"SXM\\"\\\\ \\nrev"' in ours


def test_xid_counts_render_like_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {("1", "GPU-b", "79"): 2, ("0", "GPU-a", "13"): 1}
    monkeypatch.setattr(XidWatcher, "counts", lambda self: counts)
    ours, theirs = same_scrape_both_ways(healthy_h100(2), xids=True)
    assert ours == theirs
    assert b'nvml_gpu_xid_errors_total{gpu="1",uuid="GPU-b",xid="79"} 2.0' in ours


def test_label_text_is_built_once_and_the_cache_is_bounded() -> None:
    cache = LabelText(limit=3)
    base = (("uuid", "GPU-1"), ("gpu", "0"))
    first = cache.get(base, (("clock", "sm"),))
    assert first[0] == '{clock="sm",gpu="0",uuid="GPU-1"}'
    assert cache.get(base, (("clock", "sm"),)) is first  # reused, not rebuilt
    for n in range(5):
        cache.get(((f"k{n}", "v"),))
    assert len(cache._cache) <= 3
    assert cache.get(()) == ("", {})
