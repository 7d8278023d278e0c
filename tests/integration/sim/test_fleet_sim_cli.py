"""`gpuops fleet sim` as a user starts it: its file_sd file in the state directory unless told
(never in the folder it is started from), and a control or node port in use named with its
flag."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def test_the_default_sd_file_is_in_the_state_directory(tmp_path: Path) -> None:
    here = tmp_path / "checkout"
    here.mkdir()
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    args = ["fleet", "sim", "--control-port", "0", "--first-node-port", "0", "--nodes", "2"]
    gpuops = Path(sys.executable).parent / "gpuops"
    proc = subprocess.Popen([str(gpuops), *args], cwd=here, env=env, stderr=subprocess.DEVNULL)
    sd = tmp_path / "state" / "gpuops" / "gpu-nodes.json"
    try:
        wait_for(sd.exists, 60, f"{sd} to be written")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [g["labels"]["node"] for g in json.loads(sd.read_text())] == ["node-0", "node-1"]
    assert list(here.iterdir()) == []


def test_a_control_port_in_use_is_named_with_its_flag(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = ["fleet", "sim", "--control-port", str(port), "--first-node-port", "0"]
        result = CliRunner().invoke(cli, [*args, "--sd-file", str(tmp_path / "sd.json")])
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: the fleet cannot listen on 127.0.0.1:{port}: Address already in use; choose"
        " another port with --control-port (0: a free port)\n"
    )


def test_a_node_port_in_use_is_named_with_its_flag(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = ["fleet", "sim", "--control-port", "0", "--first-node-port", str(port)]
        args += ["--nodes", "1", "--sd-file", str(tmp_path / "sd.json")]
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (
        f"Error: the fleet's nodes cannot listen on 127.0.0.1: port {port} (node-0) in use;"
        " choose another --first-node-port (node n listens on it + n; 0: free ports)"
    )
