"""The node agent's reboot of its node: the remediation ladder's ``reboot`` step where the
scheduler cannot reboot a node (Kubernetes), for the engine's ``nvml-agent`` executor.

``gpuops.exporters.nvml.server`` serves it with the agent's token (``GET /api/v1/node``: the
node's name and boot id; ``POST /api/v1/node/reboot``) when the exporter runs with
``--agent-reboot``. A request names the node it is meant for; an agent on another node (an
address that now leads elsewhere) refuses it and reboots nothing. A decision id reboots the
node once, across the reboot itself: before the reboot command starts, the id and the boot it
was asked in (the kernel's boot id, new at every boot) are written to a state file under the
agent's state directory, which outlives the reboot, and once the command started, that it did.
The same id again is answered from that file: ``rebooted`` once the boot id changed (whatever
became of the command: the shutdown it starts may kill it), ``rebooting`` while it has not,
and a refusal when the command failed, or never started (the agent stopped between the two
writes: found when the agent starts, and logged). The command (default ``systemctl reboot``)
starts after the answer went out, in a session of its own; nothing a request carries is in
its argv.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuops.exporters.nvml.agent import AgentError

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""Linux's id of the running boot (a random UUID the kernel draws at each boot)."""
DEFAULT_COMMAND = ("systemctl", "reboot")
STATE_FILE = "reboots.json"
REMEMBER = 256
"""How many decisions' reboots the state file keeps, the newest."""
NEVER_STARTED = "its command never started (the agent stopped after recording it)"
"""Why a reboot recorded in this boot, its command's start not recorded, failed."""

BootId = Callable[[], str]
"""The id of the running boot; raises ``AgentError`` when it cannot be read."""


def boot_id_of(path: Path) -> BootId:
    """The boot id read from ``path`` (default: the kernel's)."""

    def read() -> str:
        try:
            found = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise AgentError(503, f"cannot read this node's boot id from {path}: {exc}") from None
        if not found:
            raise AgentError(503, f"{path} holds no boot id")
        return found

    return read


class Rebooter:
    """Reboots this node once per decision id (module docstring); thread-safe."""

    def __init__(
        self,
        state_dir: Path,
        command: Sequence[str] = DEFAULT_COMMAND,
        boot_id: BootId | None = None,
        remember: int = REMEMBER,
        *,
        node: str,
    ) -> None:
        """``node``: this node's name as the scheduler knows it (what a request must name)."""
        if not command:
            raise ValueError("the reboot command is empty")
        if not node:
            raise ValueError("the node agent's reboot needs this node's name")
        self.name = node
        self.state_dir = state_dir
        self.command = tuple(command)
        self._boot_id = boot_id or boot_id_of(BOOT_ID)
        self.remember = remember
        self._lock = threading.Lock()

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def node(self) -> dict[str, Any]:
        """What ``GET /api/v1/node`` answers: this node's name and the running boot's id."""
        return {"node": self.name, "boot_id": self._boot_id()}

    def start(self) -> None:
        """At the agent's start: a reboot recorded in this boot whose command never started
        (the agent stopped between recording it and starting it) is marked failed, so that a
        retry of its decision is refused rather than told it is under way; logged at WARNING."""
        try:
            with self._lock:
                now = self._boot_id()
                records = self._read()
                stopped = [
                    decision_id
                    for decision_id, record in records.items()
                    if isinstance(record, dict)
                    and record.get("boot_id") == now
                    and not record.get("started")
                    and not record.get("failed")
                ]
                for decision_id in stopped:
                    records[decision_id]["failed"] = NEVER_STARTED
                if stopped:
                    self._write(records)
        except AgentError as exc:
            log.error("the node agent's reboot state: %s", exc.message)
            return
        for decision_id in stopped:
            log.warning("the reboot of decision %s failed: %s", decision_id, NEVER_STARTED)

    def reboot(
        self, decision_id: str | None, node: str | None
    ) -> tuple[dict[str, Any], Callable[[], None] | None]:
        """The answer to a reboot of ``node`` asked for ``decision_id``, and what starts the
        reboot once the answer went out (None: this decision's reboot was asked before)."""
        if not decision_id:
            raise AgentError(400, "decision_id is required: a node is rebooted once per decision")
        if not node:
            raise AgentError(400, "node is required: the name of the node to reboot")
        if node != self.name:
            raise AgentError(
                409,
                f"this agent is on node {self.name}, the reboot of decision {decision_id} is"
                f" for node {node}: nothing rebooted",
            )
        with self._lock:
            now = self._boot_id()
            records = self._read()
            record = records.get(decision_id)
            if record is None:
                records[decision_id] = {"boot_id": now, "at": time.time()}
                self._write(records)  # before the command: the same id never reboots twice
        if record is not None:
            return self._replay(decision_id, record, now), None
        log.warning("rebooting this node for decision %s: %s", decision_id, " ".join(self.command))
        answer = {
            "action": "reboot",
            "decision_id": decision_id,
            "boot_id": now,
            "rebooting": True,
            "replayed": False,
        }
        return answer, lambda: self._start(decision_id)

    def _replay(self, decision_id: str, record: dict[str, Any], now: str) -> dict[str, Any]:
        before = str(record.get("boot_id", ""))
        rebooted = before != now  # whatever the command's record says: the shutdown ends it
        if record.get("failed") and not rebooted:
            raise AgentError(
                409, f"the reboot of decision {decision_id} failed: {record['failed']}"
            )
        log.info(
            "decision %s: reboot already asked (%s); not repeated",
            decision_id,
            "the node rebooted since" if rebooted else "under way",
        )
        return {
            "action": "reboot",
            "decision_id": decision_id,
            "boot_id": before,
            "rebooting": not rebooted,
            "rebooted": rebooted,
            "now_boot_id": now,
            "replayed": True,
        }

    def _start(self, decision_id: str) -> None:
        try:
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # the agent's end does not end the reboot
            )
        except OSError as exc:
            self._failed(decision_id, f"the reboot command could not start: {exc}")
            return
        self._mark(decision_id, "started", time.time())
        threading.Thread(
            target=self._watch, args=(decision_id, proc), name="agent-reboot", daemon=True
        ).start()

    def _watch(self, decision_id: str, proc: subprocess.Popen[bytes]) -> None:
        _, err = proc.communicate()
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip()[-256:]
            self._failed(decision_id, f"the reboot command exited {proc.returncode}: {said}")

    def _failed(self, decision_id: str, why: str) -> None:
        log.error(
            "the reboot of decision %s failed: %s (%s)", decision_id, why, " ".join(self.command)
        )
        self._mark(decision_id, "failed", why)

    def _mark(self, decision_id: str, key: str, value: object) -> None:
        """Keep ``key`` in the record of ``decision_id`` (an error is logged: the command runs)."""
        with self._lock:
            try:
                records = self._read()
                records.setdefault(decision_id, {})[key] = value
                self._write(records)
            except AgentError as exc:
                log.error("decision %s: %s", decision_id, exc.message)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.state_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise AgentError(
                503, f"cannot read the reboot state {self.state_file}: {exc}"
            ) from None
        try:
            records = json.loads(text)
        except ValueError as exc:
            raise AgentError(
                503, f"the reboot state {self.state_file} is not JSON ({exc}): no reboot"
            ) from None
        if not isinstance(records, dict):
            raise AgentError(503, f"the reboot state {self.state_file} is not a JSON object")
        return records

    def _write(self, records: dict[str, dict[str, Any]]) -> None:
        kept = dict(list(records.items())[-self.remember :])
        temp = self.state_file.with_suffix(".tmp")
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            with temp.open("w", encoding="utf-8") as out:
                json.dump(kept, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.state_file)
            directory = os.open(self.state_dir, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise AgentError(
                503, f"cannot keep the reboot state in {self.state_dir}: {exc}: no reboot"
            ) from None
