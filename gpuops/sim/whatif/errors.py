"""The what-if's own error: why a what-if cannot run.

Raised by the loop (``gpuops.sim.whatif.loop``: a stalled action), the rules' checks
(``gpuops.sim.whatif.queries``: a window too short for the scrape interval), the runs and
their Prometheus (``gpuops.sim.whatif.runs``, ``gpuops.sim.whatif.prometheus``); the command
(``gpuops.cli.whatif``) prints it.
"""


class WhatifError(Exception):
    """The what-if cannot run (no Prometheus, rules that do not load, a stalled action)."""
