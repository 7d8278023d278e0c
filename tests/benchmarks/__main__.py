"""Runs every benchmark in this folder (``make bench``); each prints its own figures."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

here = Path(__file__).parent
names = sys.argv[1:] or sorted(p.stem for p in here.glob("bench_*.py"))
for name in names:
    print(f"\n=== {name} ===", flush=True)
    sys.argv = [name]
    runpy.run_module(f"tests.benchmarks.{name}", run_name="__main__")
