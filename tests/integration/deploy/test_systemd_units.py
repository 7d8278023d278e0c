"""deploy/systemd: ``systemd-analyze verify`` accepts each unit where it is installed, the
node agent's with its reboot drop-in too, and finds an unknown key."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
UNITS = sorted((REPO / "deploy" / "systemd").glob("*.service"))
BINARY = "/opt/gpuops/bin/gpuops"


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verifies_the_unit(path: Path, tmp_path: Path) -> None:
    """With the unit's program and users replaced by what exists here (the check looks for
    the binary and needs no gpuops user)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    gpuops = Path(sys.executable).parent / "gpuops"
    assert gpuops.exists(), gpuops
    text = path.read_text().replace(BINARY, str(gpuops))
    text = re.sub(r"^(User|Group)=.*$", "", text, flags=re.M)
    copy = tmp_path / path.name
    copy.write_text(text)
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    said = [line for line in (done.stdout + done.stderr).splitlines() if path.name in line]
    assert done.returncode == 0 and not said, done.stdout + done.stderr


def test_systemd_analyze_finds_an_unknown_key(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    copy = tmp_path / "broken.service"
    copy.write_text("[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\nNoSuchKey=1\n")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert "broken.service" in done.stdout + done.stderr


def test_systemd_analyze_verifies_the_node_agent_with_its_reboot_drop_in(tmp_path: Path) -> None:
    """The drop-in is read from the unit's folder (SYSTEMD_UNIT_PATH): a key it does not know
    there is found, and the shipped one has none."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    gpuops = str(Path(sys.executable).parent / "gpuops")
    name = "gpuops-node-agent.service"
    shipped = REPO / "deploy" / "systemd"
    (tmp_path / name).write_text((shipped / name).read_text().replace(BINARY, gpuops))
    (tmp_path / f"{name}.d").mkdir()
    drop_in = tmp_path / f"{name}.d" / "reboot.conf"
    text = (shipped / f"{name}.d" / "reboot.conf").read_text().replace(BINARY, gpuops)

    def said(conf: str) -> list[str]:
        drop_in.write_text(conf)
        done = subprocess.run(
            [analyze, "verify", "--man=no", str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"},
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        return [line for line in out.splitlines() if "reboot.conf" in line or name in line]

    assert said(text) == []
    assert "Unknown key 'NoSuchKey'" in "".join(said(text + "NoSuchKey=1\n"))
