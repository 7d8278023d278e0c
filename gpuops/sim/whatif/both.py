"""Both runs of one seeded workload: the policies-off run (in a process of its own when it is
large) beside the policies-on run with its Prometheus, in throwaway directories.

Called through ``gpuops.sim.whatif`` (``whatif``) by ``gpuops.cli.whatif`` and the benchmark;
``gpuops.sim.whatif.report`` compares the two runs.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from gpuops.sim.fleet.config import FleetConfig, HarmLimits
from gpuops.sim.fleet.rollout import RolloutSpec
from gpuops.sim.reliability import FaultPlan
from gpuops.sim.whatif.errors import WhatifError
from gpuops.sim.whatif.prometheus import prometheus
from gpuops.sim.whatif.runs import SCRAPE_INTERVAL_S, RunResult, run_off, run_on


def _scratch() -> str | None:
    """Where a run without ``--workdir`` keeps the engine's throwaway state file and audit
    spool: memory (``/dev/shm``) when the machine has it — the engine fsyncs both at every
    evaluation, as it must live, which a what-if need not pay on a disk — else the system's
    temporary directory. (Prometheus' data stays on disk: it is large.)"""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


OFF_PROCESS_GPU_HOURS = 1000.0
"""From how many GPU-hours (GPUs x virtual hours) on the baseline runs in a process of its
own, beside the "on" run: a 500-GPU day's baseline (~40 s) then costs no wall time, as the
"on" run, in lockstep, leaves a core free much of the time; a small one is not worth the
~2 s of CPU a fresh interpreter takes to import the engine."""


def _baseline(
    stack: ExitStack,
    config: FleetConfig,
    hours: float,
    scrape_interval_s: float,
    faults: FaultPlan | None = None,
) -> Callable[[], RunResult]:
    """The policies-off run: started in a Python process of its own (nothing shared but
    ``config``, pickled through a pipe; not ``multiprocessing``, which would run the
    caller's main module again) when it is large, else run here now. Returns how to wait
    for its result."""
    gpus = sum(p.nodes * p.gpus_per_node for p in config.pools)
    if gpus * hours < OFF_PROCESS_GPU_HOURS:
        done = run_off(config, hours, scrape_interval_s, faults)
        return lambda: done
    child = stack.enter_context(
        subprocess.Popen(
            [sys.executable, "-c", "from gpuops.sim.whatif.both import _off_child; _off_child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(pickle.dumps((config, hours, scrape_interval_s, faults)))
    child.stdin.close()

    def result() -> RunResult:
        assert child.stdout is not None
        out = child.stdout.read()
        if child.wait() != 0:
            raise WhatifError(f"the policies-off run failed (exit status {child.returncode})")
        found = pickle.loads(out)
        assert isinstance(found, RunResult)
        return found

    return result


def _off_child() -> None:
    """The policies-off run in a child process (``_baseline``): arguments pickled on stdin,
    the ``RunResult`` pickled on stdout."""
    config, hours, scrape_interval_s, faults = pickle.loads(sys.stdin.buffer.read())
    done = run_off(config, hours, scrape_interval_s, faults)
    sys.stdout.buffer.write(pickle.dumps(done))


@dataclass(frozen=True)
class Whatif:
    """Both runs of one seeded workload."""

    fleet: str
    hours: float
    seed: int
    rules: tuple[str, ...]
    off: RunResult
    on: RunResult
    limits: HarmLimits = HarmLimits()
    """What a policy may cost before the report flags it (``gpuops.sim.whatif.harm``)."""
    non_preemptible: tuple[str, ...] = ()
    """The priority classes the fleet file marks ``preemptible: false``."""
    faults: FaultPlan | None = None
    """The GPU faults injected into both runs (``--faults``)."""


def whatif(
    config: FleetConfig,
    rules: list[Path],
    hours: float,
    prometheus_url: str | None = None,
    workdir: Path | None = None,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
    progress: Callable[[str, float], None] | None = None,
    all_series: bool = False,
    rollout: RolloutSpec | None = None,
    faults: FaultPlan | None = None,
) -> Whatif:
    """Run ``config`` for ``hours`` without and with the policies of ``rules`` (writing
    every series to Prometheus with ``all_series``, else only those the rules read);
    ``rollout``: a batch operation rolled over the cluster of the policies-on run;
    ``faults``: GPU faults injected into both runs (the same ones)."""
    with (
        tempfile.TemporaryDirectory(prefix="gpuops-whatif-", dir=_scratch()) as tmp,
        tempfile.TemporaryDirectory(prefix="gpuops-whatif-prometheus-") as tmp_prom,
    ):
        engine_dir = workdir / "engine" if workdir else Path(tmp)
        prom_dir = workdir / "prometheus" if workdir else Path(tmp_prom)
        prom_dir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            baseline = _baseline(stack, config, hours, scrape_interval_s, faults)
            with prometheus(prom_dir, prometheus_url) as served:
                on = run_on(
                    config,
                    rules,
                    hours,
                    served.url,
                    engine_dir,
                    scrape_interval_s,
                    None if progress is None else (lambda t: progress("on", t)),
                    served.cpu_s,
                    all_series,
                    rollout,
                    faults,
                )
            off = baseline()
        if progress is not None:
            progress("off", hours * 3600.0)
    return Whatif(
        config.name,
        hours,
        config.seed,
        tuple(map(str, rules)),
        off,
        on,
        config.harm_limits,
        tuple(pc.name for pc in config.priority_classes if not pc.preemptible),
        faults,
    )
