"""A real Slurm cluster per test (munged, slurmctld, 2 slurmd with fake GPUs, 1 CLOUD node):
it starts in well under a second, so each test gets a fresh one. Its directory is short and
under /tmp: munge's and slurmstepd's Unix sockets live there (108-byte path limit)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.sim.slurmcluster import SlurmCluster


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    root = Path(tempfile.mkdtemp(prefix="gpuops-slurm-", dir="/tmp"))
    cluster = SlurmCluster(root).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        import os

        if not os.environ.get("KEEP_SLURM"):
            shutil.rmtree(root, ignore_errors=True)
