"""Which XID events make a GPU faulty: per GPU, per code, within the code's window."""

from __future__ import annotations

from gpuops.model.health.catalogue import Remedy
from gpuops.model.health.catalogue_file import shipped_catalogue
from gpuops.model.health.faults import XidEvent, xid_faults

CATALOGUE = shipped_catalogue()
NOW = 1_800_000_000.0


def test_a_crashed_jobs_xid_45_on_80_nodes_faults_no_gpu() -> None:
    events = [
        XidEvent(f"node{n:03d}", f"GPU-{n:03d}-{g}", 45, NOW - 5)
        for n in range(80)
        for g in range(8)
    ]
    assert xid_faults(CATALOGUE, events, NOW) == []


def test_xid_45_past_its_threshold_on_one_gpu_faults_exactly_that_gpu() -> None:
    flood = [XidEvent(f"node{n:03d}", f"GPU-{n:03d}", 45, NOW - 5) for n in range(80)]
    repeated = [XidEvent("node007", "GPU-007", 45, NOW - 60 * i) for i in range(1, 10)]
    faults = xid_faults(CATALOGUE, flood + repeated, NOW)
    assert [(f.node, f.gpu, f.entry.code, f.count) for f in faults] == [
        ("node007", "GPU-007", 45, 10)
    ]
    assert faults[0].remedy is Remedy.RESET_GPU
    assert faults[0].last_at == NOW - 5


def test_events_outside_the_window_do_not_count() -> None:
    events = [XidEvent("n1", "GPU-1", 45, NOW - 60 * i) for i in range(10)]  # 0..9 minutes ago
    assert len(xid_faults(CATALOGUE, events, NOW)) == 1
    later = NOW + 61  # the oldest is now past 10 minutes
    assert xid_faults(CATALOGUE, events, later) == []


def test_one_hardware_xid_faults_its_gpu_with_its_remedy() -> None:
    faults = xid_faults(CATALOGUE, [XidEvent("n1", "GPU-1", 79, NOW - 1)], NOW)
    assert [(f.gpu, f.remedy) for f in faults] == [("GPU-1", Remedy.REBOOT_NODE)]


def test_a_cancelling_code_clears_the_count_before_it() -> None:
    contained = [XidEvent("n1", "GPU-1", 94, NOW - 3600 * i) for i in (1, 2, 3)]
    assert [f.entry.code for f in xid_faults(CATALOGUE, contained, NOW)] == [94]
    remapped = XidEvent("n1", "GPU-1", 63, NOW - 1800)
    assert xid_faults(CATALOGUE, [*contained, remapped], NOW) == []
    elsewhere = XidEvent("n1", "GPU-2", 63, NOW - 1800)  # another GPU's remap cancels nothing
    assert len(xid_faults(CATALOGUE, [*contained, elsewhere], NOW)) == 1


def test_unknown_ignored_and_future_events_are_no_faults() -> None:
    events = [
        XidEvent("n1", "GPU-1", 1, NOW - 1),  # not in the catalogue
        XidEvent("n1", "GPU-1", 92, NOW - 1),  # action none
        XidEvent("n1", "GPU-1", 79, NOW + 5),  # after now
    ]
    assert xid_faults(CATALOGUE, events, NOW) == []
