"""`gpuops demo` stops every process it started on Ctrl-C (SIGINT) or SIGTERM, and still prints
its summary."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_and_prints_the_summary(tmp_path: Path, signum: int) -> None:
    gpuops = Path(sys.executable).parent / "gpuops"
    proc = subprocess.Popen(
        [str(gpuops), "demo", "--audit-dir", str(tmp_path / "audit")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("engine: 4 policies" in line for line in lines), 60, "the engine")
        ports = {
            int(m.group(1))
            for line in lines
            for m in [re.search(r"(?:Prometheus: |at )http://127\.0\.0\.1:(\d+)", line)]
            if m
        }
        assert len(ports) == 2  # Prometheus and the fleet's control API
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    output = "".join(lines)
    assert "== gpuops demo summary" in output
    assert all(refuses(port) for port in ports), output
