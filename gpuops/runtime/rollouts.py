"""``BatchHost``: the batch operations the engine runs itself, each on a thread of its own on
the leader, through the batch runner (``gpuops.runtime.batch``: every step through the gate).

The API starts and resumes operations here; the facade ``kick``s it when the engine starts,
when this replica is elected (docs/ha.md) and every few seconds: each operation stored as
``running`` that no thread of this engine drives gets one — after a restart or a takeover it
goes on where it stopped, a node in the middle of its procedure from its next step. A standby
drives nothing. ``stop`` halts each operation between two steps (a running step finishes, or
is cancelled with ``on_stop: cancel``) and leaves it ``running`` for the next start; an admin's
``cancel`` halts it the same way, then returns the nodes it holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuops.integrations.ansible.inventory import InventoryError, inventory_hosts
from gpuops.model.batch.opfile import parse_operation
from gpuops.model.batch.plan import PlanError
from gpuops.model.rules.model import RuleError, RulesError
from gpuops.runtime.batch import BatchError, BatchRecord, BatchRunner, BatchStatus, FleetView
from gpuops.store.errors import StateError

log = logging.getLogger(__name__)

NO_FLEET = (
    "the engine has no fleet for batch operations: set batch.nodes (a nodes file) or"
    " batch.slurm: true in its configuration (docs/batch.md)"
)
CANCEL_WAIT_S = 5.0
"""How long ``cancel`` waits for a driven operation to stop before it answers (it is
cancelled once its running steps end, whatever the wait)."""


class BatchHost:
    """Drives the ``running`` operations of the store on the leader, one thread each."""

    def __init__(
        self,
        runner: BatchRunner,
        *,
        fleet: FleetView | None,
        folder: Path,
        leading: Callable[[], bool],
    ) -> None:
        """``fleet``: what operations are planned over (None: none is hosted); ``folder``:
        where the paths of an operation posted without a folder are relative to."""
        self._runner = runner
        self._fleet = fleet
        self._folder = folder
        self._leading = leading
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._cancelling: set[str] = set()
        self._stopping = False

    # --- what the API asks -----------------------------------------------------------------
    def start(self, text: str, file: str, folder: str | None = None, by: str = "") -> str:
        """Store the operation ``text`` (its file named ``file``, its paths relative to
        ``folder`` or the configured one; ``by``: who starts it) and drive it. ``RulesError``
        (each problem ``FILE:LINE: field: what``) or ``PlanError`` (each ``field: what``) when
        it cannot run; ``BatchError`` when the engine has no fleet."""
        base = Path(folder) if folder else self._folder
        if not base.is_absolute():
            raise RulesError([RuleError(file, 1, f"folder: {folder!r} is not an absolute path")])
        operation = parse_operation(text, file, base)
        if self._fleet is None:
            raise BatchError(NO_FLEET)
        inventory = None
        if operation.step.inventory is not None:
            try:
                inventory = inventory_hosts(Path(operation.step.inventory))
            except InventoryError as exc:
                raise PlanError([f"step.inventory: {exc}"]) from None
        batch_id = self._runner.start(operation, text, self._fleet, inventory, by=by, folder=base)
        log.warning("batch %s of %s started by %s", batch_id, file, by or "an unknown user")
        self.kick()
        return batch_id

    def resume(self, batch_id: str) -> BatchRecord:
        """Let a paused operation go on (past the nodes failed so far) and drive it."""
        rec = self._runner.resume(batch_id)
        self.kick()
        return rec

    def approve(self, batch_id: str, user: str) -> BatchRecord:
        """Let an operation that waits for an approval run, and drive it."""
        rec = self._runner.approve(batch_id, user)
        self.kick()
        return rec

    def cancel(self, batch_id: str) -> BatchRecord:
        """Cancel the operation: when a thread drives it, halt it between steps first (a
        running step finishes, or is cancelled with ``on_stop: cancel``), then return its
        nodes; answers after at most ``CANCEL_WAIT_S`` with the record as it is then."""
        with self._lock:
            thread = self._threads.get(batch_id)
            driven = thread is not None and thread.is_alive()
            if driven:
                self._cancelling.add(batch_id)
        if not driven:
            return self._runner.cancel(batch_id)
        assert thread is not None
        log.warning("batch %s: cancel asked; it stops between two steps", batch_id)
        thread.join(CANCEL_WAIT_S)
        return self._runner.record(batch_id)

    def driven(self) -> list[str]:
        """The operations a thread of this engine drives now."""
        with self._lock:
            return sorted(i for i, t in self._threads.items() if t.is_alive())

    # --- driving ---------------------------------------------------------------------------
    def kick(self) -> None:
        """Drive each ``running`` operation no thread drives (the leader's; a standby, a
        stopping engine and one without a fleet start none)."""
        if self._stopping or self._fleet is None or not self._leading():
            return
        try:
            running = [b.id for b in self._runner.stored() if b.status == BatchStatus.RUNNING]
        except StateError as exc:
            log.warning("batch operations not read from the state: %s", exc)
            return
        for batch_id in running:
            with self._lock:
                if self._stopping:
                    return
                thread = self._threads.get(batch_id)
                if thread is not None and thread.is_alive():
                    continue
                thread = threading.Thread(
                    target=self._drive,
                    args=(batch_id,),
                    name=f"gpuops-batch-{batch_id}",
                    daemon=True,
                )
                self._threads[batch_id] = thread
            thread.start()

    def _halted(self, batch_id: str) -> str | None:
        if self._stopping:
            return "the engine is stopping"
        if batch_id in self._cancelling:
            return "cancelled by an admin"
        return None

    def _drive(self, batch_id: str) -> None:
        fleet = self._fleet
        assert fleet is not None  # kick drives nothing without one
        try:
            log.info("batch %s: driven by this engine", batch_id)
            rec = self._runner.run(batch_id, fleet, lambda: self._halted(batch_id))
            log.info("batch %s: %s%s", batch_id, rec.status, f" ({rec.why})" if rec.why else "")
            if batch_id in self._cancelling and self._leading():
                self._runner.cancel(batch_id)
        except (BatchError, StateError) as exc:  # fenced, the state unreachable: the next
            log.warning("batch %s stopped: %s", batch_id, exc)  # kick (or leader) goes on
        except Exception as exc:  # a bug must not end the engine: the operation pauses
            log.exception("batch %s: its driver failed", batch_id)
            self._pause(batch_id, f"the engine's driver failed: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._cancelling.discard(batch_id)
                if self._threads.get(batch_id) is threading.current_thread():
                    del self._threads[batch_id]

    def _pause(self, batch_id: str, why: str) -> None:
        if not self._leading():
            return
        try:
            self._runner.pause(batch_id, why)
        except (BatchError, StateError) as exc:
            log.warning("batch %s not paused: %s", batch_id, exc)

    def stop(self, timeout: float = 60.0) -> None:
        """Halt every driven operation between two steps and wait (at most ``timeout``
        seconds in all) for their threads; the operations stay ``running`` for the next
        start."""
        with self._lock:
            self._stopping = True
            threads = list(self._threads.values())
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
