"""A node's boot for the node agent's reboot in tests (``gpuops.exporters.nvml.reboot``): the
reboot command is this file run as a script (it imports nothing of gpuops), which draws a new
boot id into the boot id file (as the kernel does at each boot) and counts the reboot;
``FakeBoot.boot_id`` reads that file for the agent and, at the first read of a new boot, tells
``on_boot`` (the fake NVML's GPUs come back as a reboot leaves them). Run as a script:
``reboot.py BOOT_ID_FILE COUNT_FILE [--fail | --killed]`` (``--fail``: a reboot command that
exits 1, rebooting nothing; ``--killed``: one that the shutdown it started kills, SIGTERM, as
systemd's shutdown does to ``systemctl reboot``: the node rebooted, the command failed)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path


class FakeBoot:
    """The boot of one fake node, kept in ``folder``."""

    def __init__(self, folder: Path, on_boot: Callable[[], None] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / "boot_id"
        self.count_file = folder / "reboots"
        self.file.write_text(str(uuid.uuid4()) + "\n", encoding="utf-8")
        self._on_boot = on_boot
        self._seen = self._read()
        self._lock = threading.Lock()

    def command(self, fail: bool = False, killed: bool = False) -> list[str]:
        """The reboot command of this node's agent."""
        how = ["--fail"] if fail else ["--killed"] if killed else []
        return [sys.executable, __file__, str(self.file), str(self.count_file), *how]

    @property
    def reboots(self) -> int:
        """How often the reboot command rebooted the node."""
        return len(self.argv())

    def argv(self) -> list[list[str]]:
        """The arguments of each reboot command run (after this script's path)."""
        if not self.count_file.exists():
            return []
        lines = self.count_file.read_text(encoding="utf-8").splitlines()
        return [list(json.loads(line)) for line in lines]

    def _read(self) -> str:
        return self.file.read_text(encoding="utf-8").strip()

    def boot_id(self) -> str:
        """The running boot's id, as the agent reads it."""
        with self._lock:
            now = self._read()
            if now != self._seen:
                self._seen = now
                if self._on_boot is not None:
                    self._on_boot()
            return now


def _reboot(boot_id_file: str, count_file: str, fail: bool, killed: bool) -> int:
    if fail:
        print("Failed to reboot system via logind: Access denied", file=sys.stderr)
        return 1
    with open(count_file, "a", encoding="utf-8") as out:
        out.write(json.dumps(sys.argv[1:]) + "\n")  # what it was run with
    drawn = Path(boot_id_file + ".new")
    drawn.write_text(str(uuid.uuid4()) + "\n", encoding="utf-8")
    os.replace(drawn, boot_id_file)  # whole: the agent never reads half an id
    if killed:
        os.kill(os.getpid(), signal.SIGTERM)  # the shutdown ends the command that asked for it
    return 0


if __name__ == "__main__":
    how = sys.argv[3:]
    sys.exit(_reboot(sys.argv[1], sys.argv[2], "--fail" in how, "--killed" in how))
