"""gres.conf → the device minor number of each GPU GRES index, per node, for the Slurm
exporter's GPU↔job join (``gpuops.exporters.slurm.collector``).

Slurm numbers a node's GPUs in the order of their ``File=`` devices in gres.conf, so with
``File=/dev/nvidia[1,3]`` index 0 is minor number 1. Only ``Name=gpu`` lines with ``File=`` are
read; ``NodeName=`` hostlists are expanded by ``scontrol show hostnames``. A node without such a
line is not in the result: the collector then takes index = minor number.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuops.integrations.slurm.client import SlurmClient


class GresConfError(ValueError):
    """gres.conf cannot be read; the message names file:line."""


def _expand(expr: str) -> list[str]:
    """``/dev/nvidia[0-1,3]`` → the device paths (one bracket group, as gres.conf uses)."""
    m = re.fullmatch(r"(.*)\[([0-9,\-]+)\](.*)", expr)
    if not m:
        return [expr]
    head, body, tail = m.groups()
    out = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        out += [f"{head}{i}{tail}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def minor_numbers(path: Path, client: SlurmClient) -> dict[str, list[int]]:
    """Per node name, the minor number of each GPU index."""
    result: dict[str, list[int]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise GresConfError(f"{path}: cannot read: {exc.strerror}") from exc
    for number, line in enumerate(lines, 1):
        words = dict(w.split("=", 1) for w in line.split("#", 1)[0].split() if "=" in w)
        words = {k.lower(): v for k, v in words.items()}
        if words.get("name", "").lower() != "gpu" or "file" not in words:
            continue
        minors = []
        for device in _expand(words["file"]):
            digits = re.search(r"(\d+)$", device)
            if digits is None:
                raise GresConfError(
                    f"{path}:{number}: File={words['file']}: {device!r} does not end in a "
                    "device number (expected /dev/nvidiaN)"
                )
            minors.append(int(digits.group(1)))
        nodes = client.hostnames(words["nodename"]) if "nodename" in words else ["*"]
        for node in nodes:
            result.setdefault(node, []).extend(minors)
    return result
