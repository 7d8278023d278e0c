"""`gpuops demo` as a user runs it, in a process of its own: its output lines collected as they
come, and the process killed if a test leaves it running. Used by the demo's integration and
end-to-end tests."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GPUOPS = Path(sys.executable).parent / "gpuops"
"""The command of the venv the tests run in."""


@contextmanager
def demo_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``gpuops demo ARGS``: the process and the list its stdout and stderr lines go to."""
    proc = subprocess.Popen(
        [str(GPUOPS), "demo", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
