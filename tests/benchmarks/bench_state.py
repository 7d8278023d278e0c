"""State integrity at open (issue 10): what ``PRAGMA quick_check`` and the other checks add to
opening the state file, by file size.

Run: ``python -m tests.benchmarks.bench_state``. Builds state files with 1k, 10k and 100k
decisions (the table is pruned after 30 days) and prints the file size, the time to open it with
the checks (``StateStore``) and the time of ``quick_check`` alone. Never fails on noise.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
from pathlib import Path

from gpuops.store.sqlite import StateStore


def build(path: Path, decisions: int) -> None:
    StateStore(path).close()
    doc = json.dumps({"labels": {"uuid": "GPU-00000000", "node": "node-0"}, "pad": "x" * 600})
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO decisions (id, policy, target, transition, verdict, at, status, data)"
            " VALUES (?, 'p', ?, 'fire', 'execute', ?, 'done', ?)",
            ((f"d{i}", f"GPU-{i}", float(i), doc) for i in range(decisions)),
        )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for decisions in (1_000, 10_000, 100_000):
            path = Path(tmp) / f"state-{decisions}.sqlite"
            build(path, decisions)
            started = time.perf_counter()
            StateStore(path).close()
            opened = time.perf_counter() - started
            db = sqlite3.connect(path)
            started = time.perf_counter()
            db.execute("PRAGMA quick_check").fetchall()
            checked = time.perf_counter() - started
            db.close()
            size = path.stat().st_size / 1e6
            print(
                f"{decisions:>7} decisions {size:7.1f} MB   open with checks"
                f" {opened * 1000:8.1f} ms   quick_check {checked * 1000:8.1f} ms"
            )


if __name__ == "__main__":
    main()
