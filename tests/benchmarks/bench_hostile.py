"""Hostile inputs (issue 10): how fast the bounded YAML parser refuses what would hurt, and what
the freshness check costs per evaluation.

Run: ``python -m tests.benchmarks.bench_hostile``. Prints milliseconds and peak traced memory
to refuse an alias bomb (9 levels of 9 aliases, 387 million nodes expanded), 4 MiB of nesting
and a file over the size limit, to parse the shipped rules, and to build the stale-series probe of
a policy (cached after the first time). Never fails on noise.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuops.model.rules.yamlsource import YamlLimits, parse_yaml
from gpuops.sources.promql import input_selectors, stale_expr
from tests.unit.model.rules.test_yaml_limits import BOMB

ROOT = Path(__file__).resolve().parents[2]


def measure(name: str, work: Callable[[], Any], repeat: int = 5) -> None:
    """Mean time of ``repeat`` runs (untraced), then the peak of one run under tracemalloc."""
    started = time.perf_counter()
    for _ in range(repeat):
        work()
    elapsed = (time.perf_counter() - started) / repeat
    tracemalloc.start()
    work()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{name:<44} {elapsed * 1000:9.2f} ms   peak {peak / 1e6:7.1f} MB")


def main() -> None:
    shipped = "\n".join(p.read_text() for p in sorted((ROOT / "rules").glob("*.yaml")))
    nested = "x: " + "[" * (YamlLimits().max_bytes - 8)
    huge = "x: " + "y" * YamlLimits().max_bytes
    measure(f"alias bomb ({len(BOMB)} bytes): refused", lambda: parse_yaml(BOMB))
    measure("4 MiB of '[': refused", lambda: parse_yaml(nested), repeat=1)
    measure("over 4 MiB: refused", lambda: parse_yaml(huge), repeat=1)
    measure(f"shipped rules ({len(shipped)} bytes): parsed", lambda: parse_yaml(shipped))
    expr = (
        "max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.05"
        " and on (uuid) gpuops_gpu_allocated == 1"
    )

    def probe() -> str | None:
        return stale_expr.__wrapped__(input_selectors.__wrapped__(expr), 30.0)

    measure("stale-series probe built (first, uncached)", probe)
    measure(
        "stale-series probe built (cached)",
        lambda: stale_expr(input_selectors(expr), 30.0),
        repeat=1000,
    )


if __name__ == "__main__":
    main()
