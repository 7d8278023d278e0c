"""A fleet of nodes with GPU faults, as the command executor sees one: run as a program
(``python gpufaults.py STATE_FILE VERB NODE``) by the remediation ladder's steps in the tests,
it keeps each node's fault in ``STATE_FILE`` (JSON) and counts what was done to it.

A node's ``fault`` is what heals it: ``reset`` (a GPU reset or a reboot), ``reboot`` (a reboot
only) or ``never``; ``""`` is healthy. ``reset_gpu`` and ``reboot`` heal what they heal and
exit 0; ``validate`` exits 0 for a healthy node and 1 (saying why) for a faulty one;
``reset_gpu`` also turns the kill switch on (creates ``--kill FILE``) when asked to, so a test
can stop an engine between two steps. Real GPU resets and reboots cannot run here.
"""

from __future__ import annotations

import fcntl
import json
import sys
from pathlib import Path
from typing import Any

HEALS = {"reset_gpu": {"reset"}, "reboot": {"reset", "reboot"}}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str]) -> int:
    state_file, verb, node = Path(argv[0]), argv[1], argv[2]
    kill = argv[4] if len(argv) > 4 and argv[3] == "--kill" else None
    with open(state_file.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        nodes = load(state_file)
        entry = nodes.setdefault(node, {"fault": "", "done": []})
        entry["done"].append(verb)
        if entry["fault"] in HEALS.get(verb, ()):
            entry["fault"] = ""
        state_file.write_text(json.dumps(nodes))
    if verb in HEALS:
        if kill:
            Path(kill).touch()
        return 0
    if verb == "validate":
        if entry["fault"]:
            print(f"{node}: GPU still faulty ({entry['fault']})", file=sys.stderr)
            return 1
        return 0
    print(f"unknown verb {verb}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
