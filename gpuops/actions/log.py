"""The ``log`` executor: records an action and changes nothing (dry-run uses it too)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpuops.actions.encoding import printable
from gpuops.actions.results import Logged
from gpuops.model.decisions import Decision

log = logging.getLogger(__name__)


class LogExecutor:
    name = "log"
    verbs: frozenset[str] | None = None

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = dict(settings or {})

    def run(self, decision: Decision) -> Logged:
        verb = decision.action.type if decision.action else "-"
        # the key holds label values: escaped, so that a value cannot forge a log line
        log.info("[log] %s %s on %s", decision.policy, verb, printable(decision.target.key))
        return Logged(logged=True)
