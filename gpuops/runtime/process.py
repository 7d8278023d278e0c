"""Settings of the engine's process, made by its entry point (``gpuops engine run``, and the
benchmarks that stand in for it), never by the library.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (50_000, 20, 20)
"""The cyclic garbage collector's thresholds in the engine process (``collect_less``)."""


def collect_less() -> None:
    """Run Python's cyclic garbage collector less often (``GC_THRESHOLDS``; the default is a
    young collection every 700 allocations). A steady evaluation at 10,000 GPUs allocates about
    a million objects (samples, target states) while the policies' states (as many again) stay
    alive, so the default thresholds make the collector scan the whole heap many times an
    evaluation: two thirds of the engine's CPU (210 us per GPU with the collector tuned, 590
    without). Almost all of it is freed by reference counting; the collector only finds cycles,
    which the cycle does not make."""
    gc.set_threshold(*GC_THRESHOLDS)
