"""The order test files are handed to pytest-xdist's workers (``make pytest`` runs
``-n 3 --dist loadfile --no-loadscope-reorder -m "not serial"``, then ``-m serial`` in one
process): the longest files first, so that no worker starts a two-minute file while the others
run out of work. Only the order changes; every test
runs, and each file still runs whole on one worker (its module fixtures are made once).

``LONGEST`` comes from ``--durations`` on a 2-core machine (seconds, one process); a file not
listed keeps its collection order after them, the waiting kinds (end-to-end, integration,
browser) before the unit tests. A stale entry only costs balance, never a test.
"""

from __future__ import annotations

import pytest

LONGEST = (
    "tests/integration/test_readme_commands.py",  # 157 s: ~25 CLI runs of ~2.3 s CPU each
    "tests/e2e/test_loop.py",  # 137 s: 6 whole loops on 5 s policy groups
    "tests/integration/api/test_fuzz.py",  # 108 s, CPU: schemathesis over every operation, 4 roles
    "tests/browser/test_console.py",  # 77 s
    "tests/e2e/test_demo_story.py",  # 95 s: the compressed 35 s timeline, then the 50 s command
    "tests/integration/runtime/test_gate_crash.py",  # 36 s
    "tests/integration/slurm/test_slurm_accounting.py",  # 35 s: 200 jobs through slurmdbd
    "tests/integration/slurm/test_slurm_executor.py",  # 31 s
    "tests/integration/slurm/test_slurm_job_events.py",  # 26 s
)
WAITING_KINDS = ("tests/e2e/", "tests/integration/", "tests/browser/")
SERIAL = (
    "tests/integration/runtime/test_engine_restart.py",
    "tests/e2e/slurm/test_slurm_loop.py",
    "tests/integration/runtime/test_ha_takeover.py",
)
"""Files marked ``serial``: ``make pytest`` runs them after the workers, in one process. The
restart test bounds how late an engine subprocess (~2.3 s CPU of imports) may fire after a
restart; beside 3 workers and other engineers' runs it missed that bound in every xdist run.
The Slurm loop's CLOUD node did not come up within 60 s in 3 of 3 xdist runs (passes alone,
also at load average 18; a guess to check: its slurmd port is picked when the cluster starts
and bound only at power-up, so a busy machine may take it meanwhile). The HA takeover test's
mid-action kill found no action in flight in 1 of 2 xdist runs (its wait can end before the
first delivery: a race in the test, to fix there)."""


def _rank(item: pytest.Item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST:
        return (0, LONGEST.index(path))
    if path.startswith(WAITING_KINDS):
        return (1, 0)
    return (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: within a rank, collection order
    for item in items:
        if item.nodeid.split("::", 1)[0] in SERIAL:
            item.add_marker(pytest.mark.serial)
