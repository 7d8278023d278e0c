"""deploy/systemd: ``systemd-analyze verify`` accepts each unit where it is installed, and
finds an unknown key."""

from __future__ import annotations

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
