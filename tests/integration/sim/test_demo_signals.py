"""`gpuops demo` stops every process it started (and its API) on Ctrl-C (SIGINT) or SIGTERM, and
still prints its summary."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from tests.demo_process import demo_process
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_and_prints_the_summary(tmp_path: Path, signum: int) -> None:
    args = ["--audit-dir", str(tmp_path / "audit"), "--api-port", "0"]
    with demo_process(*args) as (proc, lines):
        wait_for(lambda: any("console: " in line for line in lines), 60, "the engine's API")
        ports = {
            int(m.group(1))
            for line in lines
            for m in [re.search(r"(?:Prometheus: |at |console: )http://127\.0\.0\.1:(\d+)", line)]
            if m
        }
        assert len(ports) == 3  # Prometheus, the fleet's control API, the engine's API
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 0
    output = "".join(lines)
    assert "== gpuops demo summary" in output
    assert all(refuses(port) for port in ports), output


def test_a_port_in_use_is_named_with_its_flag_before_anything_starts(tmp_path: Path) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with socket.create_server(("127.0.0.1", 0)) as taken:
            port = taken.getsockname()[1]
            result = CliRunner().invoke(
                cli, ["demo", "--api-port", str(port), "--workdir", str(tmp_path)]
            )
    finally:  # the command sets them for the process it runs in
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: the API cannot listen on 127.0.0.1:{port}: Address already in use (another"
        " gpuops demo or engine?); choose another port with --api-port (0: a free port)\n"
    )
    assert list(tmp_path.iterdir()) == []  # no fleet, Prometheus or engine started
