"""One playbook run, limited to some hosts, through ansible-runner: its status, which hosts
failed a task or were unreachable, and the last task that failed, in a frozen value.

ansible-runner starts ``ansible-playbook`` in its own process (its artifacts, with every event,
under ``private_dir/artifacts``), enforces the timeout and stops the run when ``cancelled``
says so. The ``ansible`` executor (``gpuops.actions.ansible``) calls it for one node's step.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def search_path() -> str:
    """``PATH`` with the folder of this Python first, so that the ``ansible-playbook`` of the
    virtualenv gpuops is installed in runs (ansible-core is one of its dependencies)."""
    return os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))


_INVENTORY_LOCK = threading.Lock()

MESSAGE_CAP = 512
"""Characters kept of a failed task's message."""


@dataclass(frozen=True)
class PlaybookRun:
    """What a run did: ``status`` is ansible-runner's (``successful``, ``failed``, ``timeout``,
    ``canceled``); the hosts that failed a task, those unreachable; the first failure said."""

    status: str
    rc: int
    failed: frozenset[str]
    unreachable: frozenset[str]
    processed: frozenset[str] = frozenset()
    """The hosts the play ran on (none: the limit matched no host of the inventory)."""
    message: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.status == "successful"
            and bool(self.processed)
            and not self.failed
            and not self.unreachable
        )


def _failure(event: Mapping[str, Any]) -> str | None:
    """``host: task: message`` of a failed or unreachable task event, else None."""
    if event.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
        return None
    data = event.get("event_data") or {}
    result = data.get("res") or {}
    message = str(result.get("msg") or result.get("stderr") or "failed")[:MESSAGE_CAP]
    return f"{data.get('host', '?')}: {data.get('task', '?')}: {message}"


def run_playbook(
    *,
    playbook: Path,
    inventory: Path,
    limit: str,
    extra_vars: Mapping[str, str],
    private_dir: Path,
    ident: str,
    timeout_s: float,
    cancelled: Callable[[], bool] = lambda: False,
) -> PlaybookRun:
    """Run ``playbook`` over the hosts of ``inventory`` that ``limit`` names; ``ident``: the
    run's folder under ``private_dir/artifacts`` (a decision id: a run again replaces it).

    ansible-runner writes the run's inputs (``env/``, behind a lock file it removes when done)
    into its private data folder, so each run gets its own, ``private_dir/runs/<ident>``: runs
    of several nodes at once never share one."""
    import ansible_runner

    first: list[str] = []

    def on_event(event: Mapping[str, Any]) -> bool:
        said = _failure(event)
        if said is not None and not first:
            first.append(said)
        return True

    data_dir = private_dir / "runs" / ident
    data_dir.mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(data_dir),
        artifact_dir=str(private_dir / "artifacts"),
        playbook=str(playbook.resolve()),
        inventory=str(inventory.resolve()),
        limit=limit,
        extravars=dict(extra_vars),
        ident=ident,
        quiet=True,
        timeout=max(1, int(timeout_s)),
        event_handler=on_event,
        cancel_callback=cancelled,
        envvars={
            "PATH": search_path(),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
        },
    )
    stats = runner.stats or {}
    failed = frozenset(stats.get("failures", {}) or {})
    unreachable = frozenset(stats.get("dark", {}) or {})
    processed = frozenset(stats.get("processed", {}) or {})
    status = str(runner.status)
    message = first[0] if first else ""
    if not message and not processed:
        message = f"no host of {inventory} matched {limit} (is the inventory readable?)"
    if not message and status != "successful":
        message = f"ansible-playbook ended {status} (rc {runner.rc})"
    log.debug("playbook %s on %s: %s rc=%s", playbook, limit, status, runner.rc)
    return PlaybookRun(
        status=status,
        rc=int(runner.rc or 0),
        failed=failed,
        unreachable=unreachable,
        processed=processed,
        message=message,
    )


def inventory_names(inventory: Path) -> tuple[frozenset[str], frozenset[str]]:
    """The host names and the group names (``all`` and ``ungrouped`` among them) of
    ``inventory``, as ansible-core's own inventory parsers read it (one at a time: ansible's
    plugin loader is process-wide and not safe to use from several threads at once)."""
    with _INVENTORY_LOCK:
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader

        manager = InventoryManager(loader=DataLoader(), sources=[str(inventory.resolve())])
    return frozenset(manager.hosts), frozenset(manager.groups) | {"all", "ungrouped"}
