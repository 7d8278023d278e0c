"""The demo's REST API and web console: an admin user made for the run, the API served on the
demo's port while the story plays, and the approvals the story asks for — told as they come,
with the two ways to grant them, and in the summary.

Used by ``gpuops.sim.demo``; the port is checked before anything starts
(``DemoPortBusy`` names the port and the flag that changes it).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuops.api import ApiServer, create_app
from gpuops.api.server import ApiServerError
from gpuops.api.tokens import add_user, hash_token
from gpuops.model.decisions import Decision, Outcome
from gpuops.model.telling import outcome_words
from gpuops.runtime import Engine
from gpuops.store.interface import Approval, ApprovalStatus

ADMIN = "demo-admin"
"""The user the demo makes for its run (role admin); its token is printed at start."""


class DemoPortBusy(Exception):
    """The demo's API port cannot be had; the message names the port and the flag."""


def check_port(listen: str, flag: str) -> None:
    """Fail now, before the fleet and Prometheus start, when ``listen`` (host:port) is taken."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.create_server((host, int(port)), family=family):
            pass
    except OSError as exc:
        raise DemoPortBusy(
            f"the API cannot listen on {host}:{port}: {os.strerror(exc.errno or 0)} (another"
            f" gpuops demo or engine?); choose another port with {flag} (0: a free port)"
        ) from None


def admin_token(tokens_file: Path) -> str:
    """A new random token of the demo's admin user, added to ``tokens_file``."""
    token = secrets.token_urlsafe(32)
    add_user(tokens_file, {"name": ADMIN, "roles": ["admin"], "token_sha256": hash_token(token)})
    return token


def serve(engine: Engine, flag: str) -> ApiServer:
    """The API and console of ``engine`` (its ``api`` settings), serving."""
    settings = engine.config.api
    assert settings.listen is not None
    try:
        return ApiServer(create_app(engine, settings), settings.listen).start()
    except ApiServerError as exc:  # taken between the check and now
        raise DemoPortBusy(f"{exc}; choose another port with {flag} PORT") from None


@dataclass(frozen=True)
class Told:
    """An approval as the summary tells it."""

    policy: str
    action: str
    target: str
    status: str
    by: str | None
    outcome: str | None


class ApprovalStory:
    """The decisions that wait for an admin: said when they begin to wait (with the console's
    page and the CLI command that grant them) and when a granted one has run."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._lock = threading.Lock()
        self._waiting: set[str] = set()
        self._outcomes: dict[str, str] = {}
        self.url = ""
        """The console's URL (set once it serves)."""

    @property
    def asked(self) -> frozenset[str]:
        """The ids of the decisions said to wait for an admin."""
        with self._lock:
            return frozenset(self._waiting)

    def on_decision(self, decision: Decision, outcome: Outcome | None) -> None:
        action = decision.action.type if decision.action else "its action"
        with self._lock:
            if decision.verdict == "awaiting_approval" and outcome is None:
                self._waiting.add(decision.id)
                where = f"on the console ({self.url}/approvals) or with" if self.url else "with"
                self._say(
                    f"waiting for an admin: {action} on {decision.target.key} ({decision.policy})"
                    f" runs once granted {where}: gpuops approvals grant {decision.id}"
                    " --reason '...'"
                )
            elif decision.id in self._waiting and outcome is not None:
                told = outcome_words(outcome, decision.action.type if decision.action else None)
                self._outcomes[decision.id] = told
                self._say(f"granted and run: {action} on {decision.target.key} -> {told}")

    def summary(self, approvals: list[Approval]) -> list[str]:
        """Lines for the end of the demo: each approval asked for, what became of it."""
        told = [self._told(a) for a in sorted(approvals, key=lambda a: a.requested_at)]
        if not told:
            return []
        lines = [f"Approvals asked for: {len(told)} (policies with approval: required)"]
        for t in told:
            status = t.status + (f" by {t.by}" if t.by else "")
            if t.outcome is not None:
                status += f", then run: {t.outcome}"
            elif t.status == ApprovalStatus.PENDING:
                status += " (nobody granted it during the demo)"
            elif t.status == ApprovalStatus.CANCELLED:
                status += " (the condition cleared before anyone granted it)"
            lines.append(f"  {t.policy}: {t.action} on {t.target} -> {status}")
        return lines

    def _told(self, approval: Approval) -> Told:
        decision = approval.decision
        with self._lock:
            outcome = self._outcomes.get(decision.id)
        return Told(
            policy=decision.policy,
            action=decision.action.type if decision.action else "-",
            target=decision.target.key,
            status=approval.status.value,
            by=approval.decided_by,
            outcome=outcome,
        )
