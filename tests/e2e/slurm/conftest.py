"""The real loop on Slurm, as `gpuops demo --slurm` starts it
(``gpuops.sim.slurmdemo.start_stack``):
a local Slurm cluster, a fake NVML exporter per static node (minor numbers as in gres.conf), the
Slurm exporter, a real Prometheus with the recording rule and the engine running
rules/demo-slurm with `scheduler` mapped to `slurm`. Tests set GPU utilization on the fakes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuops.model.decisions import Decision, Outcome
from gpuops.sim.slurmdemo import SlurmStack, start_stack
from tests.waiting import wait_for


@dataclass
class SlurmLoop:
    stack: SlurmStack | None = None
    decisions: list[tuple[Decision, Outcome | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def s(self) -> SlurmStack:
        assert self.stack is not None
        return self.stack

    def record(self, decision: Decision, outcome: Outcome | None) -> None:
        with self.lock:
            self.decisions.append((decision, outcome))

    def executed(self, policy: str, transition: str = "fire") -> list[tuple[Decision, Outcome]]:
        with self.lock:
            return [
                (d, o)
                for d, o in self.decisions
                if d.policy == policy and d.transition.value == transition and o is not None
            ]


@pytest.fixture
def slurm_loop(tmp_path: Path) -> Iterator[SlurmLoop]:
    loop = SlurmLoop()
    loop.stack = start_stack(tmp_path, tmp_path / "audit", loop.record)
    try:
        wait_for(
            lambda: loop.s.query("count(nvml_gpu_info) > 0 and on() gpuops_slurm_up == 1"),
            30,
            "Prometheus to scrape the nodes and Slurm",
        )
        loop.s.engine.start()
        yield loop
    finally:
        loop.s.stop()
