"""Which XID events make a GPU faulty, by the catalogue: a purely computational function.

``xid_faults(catalogue, events, now)`` counts each GPU's events per code within the code's
window (after the last event on that GPU that cancels it) and returns a fault for every code
past its threshold. Events are counted per GPU, never per node or per job: one crashed job that
raises an application XID on 80 nodes is 80 GPUs with one event each, and none of them is
faulty. Called by the engine's health inbox and the tests; nothing here acts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpuops.model.health.catalogue import Remedy, XidCatalogue, XidEntry


@dataclass(frozen=True)
class XidEvent:
    """One XID NVML reported for one GPU at ``at`` (Unix seconds)."""

    node: str
    gpu: str
    """The GPU's UUID."""
    code: int
    at: float


@dataclass(frozen=True)
class XidFault:
    """A GPU past one code's threshold: ``count`` events within the window, the last at
    ``last_at``."""

    node: str
    gpu: str
    entry: XidEntry
    count: int
    last_at: float

    @property
    def remedy(self) -> Remedy:
        return self.entry.fault_remedy


def xid_faults(catalogue: XidCatalogue, events: Iterable[XidEvent], now: float) -> list[XidFault]:
    """The faults ``events`` show at ``now``, by GPU then code. Codes the catalogue does not
    know and codes that never act are not faults (the caller records them)."""
    by_gpu: dict[tuple[str, str], list[XidEvent]] = defaultdict(list)
    for event in events:
        if event.at <= now:
            by_gpu[(event.node, event.gpu)].append(event)
    faults: list[XidFault] = []
    for (node, gpu), gpu_events in sorted(by_gpu.items()):
        gpu_events.sort(key=lambda e: e.at)
        cancelled_at: dict[int, float] = {}
        for event in gpu_events:
            entry = catalogue.entry(event.code)
            for code in entry.cancels if entry is not None else ():
                cancelled_at[code] = event.at
        for code in sorted({e.code for e in gpu_events}):
            entry = catalogue.entry(code)
            if entry is None or not entry.acts or entry.threshold is None:
                continue
            since = max(now - entry.threshold.window_s, cancelled_at.get(code, float("-inf")))
            counted = [e for e in gpu_events if e.code == code and e.at > since]
            if len(counted) >= entry.threshold.count:
                faults.append(XidFault(node, gpu, entry, len(counted), counted[-1].at))
    return faults
