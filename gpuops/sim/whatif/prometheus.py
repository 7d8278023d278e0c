"""The Prometheus of the policies-on run: one given by URL, or a fresh one of its own on a free
loopback port that takes remote write, with its CPU seconds read for ``RunResult.parts``.

Used by ``gpuops.sim.whatif.both`` around the policies-on run (``gpuops.sim.whatif.runs``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuops.sim.whatif.errors import WhatifError
from gpuops.sources.promproc import PrometheusServer

PROMETHEUS_ARGS = ("--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=30d")
"""A Prometheus that takes samples by remote write and keeps the past the run writes."""

PROMETHEUS_ENV = {"GOGC": "400"}
"""The run's own Prometheus collects garbage when its heap has grown 4x, not 2x (Go's
default): a quarter less of its CPU in a 500-GPU run (measured: 4.5 s instead of 6.2 s for
30 busy virtual minutes of remote write), for a heap of some hundred MB more."""


@dataclass(frozen=True)
class Served:
    """The Prometheus of the "on" run: its URL and how to read its CPU seconds so far (NaN
    when it is not ours or its process cannot be read)."""

    url: str
    cpu_s: Callable[[], float]


def _process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def prometheus(workdir: Path, url: str | None = None) -> Iterator[Served]:
    """``url`` when given (it must take remote write and hold no samples of this run's
    series), else a fresh Prometheus of its own, on a free loopback port, stopped at the end."""
    if url is not None:
        yield Served(url, lambda: math.nan)
        return
    config = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
    server = PrometheusServer(workdir, config, extra_args=list(PROMETHEUS_ARGS))
    server.env.update(PROMETHEUS_ENV)
    try:
        with server:
            assert server.proc is not None
            pid = server.proc.pid
            yield Served(server.url, lambda: _process_cpu_s(pid))
    except FileNotFoundError as exc:
        raise WhatifError(f"a Prometheus is needed for the policies-on run: {exc}") from None
