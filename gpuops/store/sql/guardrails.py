"""The guardrail windows' repository: one ``guardrails`` row (the last action per target and the
executions of the last hour), cached as committed, since the gate reads it at every action's
execution. Part of ``gpuops.store.sql.store.SqlStore``; the runtime saves the windows in the
cycle's transaction.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuops.model.guardrails import GuardrailState
from gpuops.store.codecs import guardrail_state_doc, guardrail_state_from_doc
from gpuops.store.errors import StateError
from gpuops.store.sql.base import Connection, SqlBase


class SqlGuardrails(SqlBase):
    """``gpuops.store.interface.GuardrailRepository`` in SQL: ``_guard`` is the windows as
    committed (None: not read yet), ``_guard_pending`` as the open transaction wrote them."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._guard: GuardrailState | None = None
        self._guard_pending: GuardrailState | None = None

    def _discard_pending(self) -> None:
        self._guard_pending = None
        super()._discard_pending()

    def _commit_pending(self) -> None:
        if self._guard_pending is not None:
            self._guard, self._guard_pending = self._guard_pending, None
        super()._commit_pending()

    def _forget_cache(self) -> None:
        self._guard = None
        super()._forget_cache()

    def guardrail_state(self) -> GuardrailState:
        """The guardrail windows; cached (the same value until a commit changes them), as the
        gate reads them at every action's execution."""
        with self._lock:
            self._check_cache()
            if self._guard is None:
                row = self._db.execute("SELECT data FROM guardrails WHERE id = 1").fetchone()
                self._guard = self._decode_guardrails(row[0]) if row else GuardrailState()
            return self._guard

    def _decode_guardrails(self, text: str) -> GuardrailState:
        try:
            return guardrail_state_from_doc(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # engine-wide: without its windows no cooldown would hold, so nothing may act
            raise StateError(
                f"{self.path}: the guardrails row (cooldowns, rate windows) cannot be decoded"
                f" ({type(exc).__name__}: {exc})"
            ) from exc

    def save_guardrail_state(self, db: Connection, state: GuardrailState) -> None:
        db.execute(
            "INSERT INTO guardrails (id, data) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET data = excluded.data",
            (json.dumps(guardrail_state_doc(state)),),
        )
        self._guard_pending = state
