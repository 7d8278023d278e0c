"""The rulebook: the running rule set — loaded (``gpuops.model.rules.loader``), its PromQL
checked by promtool and its verbs and params by the executor registry
(``gpuops.offline.rulecheck``, the checks of ``gpuops rules check``), watched for changes and
reloaded; on any error the running rules stay and the errors name file:line. Built by
``gpuops.runtime.facade.Engine``, which reschedules the groups after a reload (``on_change``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuops.actions.registry import ExecutorRegistry
from gpuops.model.rules.model import Policy, RuleError, RulesError, RuleSet
from gpuops.offline.rulecheck import load_checked, refuse_dropping_every_policy
from gpuops.runtime.metrics import EngineMetrics

log = logging.getLogger(__name__)

MISSING_GRACE_S = 10.0
"""How long a rule file that was loaded may be missing before the watcher reloads without it:
an editor that saves by renaming the old file away, a tool that deletes and re-creates a
file, a ``git checkout`` of the rules directory leave it missing for a moment, and a reload
then would drop its policies."""


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    policies: int
    errors: tuple[str, ...] = ()
    at: float = 0.0
    """When the reload was tried (the engine's clock)."""


class Rulebook:
    def __init__(
        self,
        paths: list[Path],
        registry: ExecutorRegistry,
        metrics: EngineMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._paths = paths
        self._registry = registry
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self.rules = RuleSet()
        self.on_change: Callable[[], None] | None = None
        self._mtimes: dict[str, float] = {}
        self._changed: dict[str, float] | None = None
        """The files as the watcher found them changed at its last check (None: unchanged)."""
        self._missing: dict[str, float] = {}
        """Loaded files the watcher found missing, and since when."""
        self._promtool_warned = False
        self.last_reload: ReloadResult | None = None
        """The last reload tried, its errors (file:line) if it failed: the rules page shows it."""

    def policy(self, name: str) -> Policy | None:
        return self.rules.policy(name)

    def reload(self, strict: bool = False) -> ReloadResult:
        """Load the rule files; on any error keep the running rules and report file:line
        (``strict``: raise the ``RulesError`` instead, for the first load)."""
        try:
            # the same checks as `gpuops rules check` (gpuops.offline.rulecheck)
            rules = load_checked(self._paths, self._registry, without_promtool=self._no_promtool)
            refuse_dropping_every_policy(self.rules, rules)  # a file emptied to `groups: []`
        except (RulesError, RecursionError, OSError, ValueError) as exc:
            self._metrics.reloads.labels("failure").inc()
            if not isinstance(exc, RulesError):  # a loader bug must not take the rules down
                log.exception("rules not reloaded: the loader failed")
                exc = RulesError([RuleError("(rules)", 0, f"{type(exc).__name__}: {exc}")])
            if strict:
                raise exc from None
            for err in exc.errors:
                log.error("rules not reloaded: %s", err)
            self.last_reload = ReloadResult(
                False,
                sum(1 for _ in self.rules.policies()),
                tuple(map(str, exc.errors)),
                self._clock(),
            )
            return self.last_reload
        with self._lock:
            self.rules = rules
            self._mtimes = self._current_mtimes()
        count = sum(1 for _ in rules.policies())
        self._metrics.reloads.labels("success").inc()
        self._metrics.rules_loaded.set(count)
        self._metrics.last_reload_success.set(self._clock())
        log.log(
            logging.INFO if count else logging.WARNING,
            "loaded %d policies in %d groups from %s",
            count,
            len(rules.groups),
            ", ".join(rules.files) or "no files",
        )
        self.last_reload = ReloadResult(True, count, at=self._clock())
        if self.on_change is not None:
            self.on_change()
        return self.last_reload

    def _no_promtool(self, exc: Exception) -> None:
        """PromQL is checked by a real parser (promtool) when there is one; said once if not."""
        if not self._promtool_warned:
            log.warning("PromQL of reloaded rules not checked: %s", exc)
            self._promtool_warned = True

    def _current_mtimes(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for path in self._paths:
            files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
            for f in files:
                try:
                    found[str(f)] = f.stat().st_mtime
                except OSError:
                    found[str(f)] = math.nan
        return found

    def check_reload(self) -> None:
        """Reload when a rule file was added, removed or changed since the last attempt, once
        the files are read the same at two checks in a row (a save, a checkout, a copy of
        several files is over: the directory is read as one consistent set) and no file that
        was loaded has been missing for less than ``MISSING_GRACE_S``."""
        current = self._current_mtimes()
        if current == self._mtimes:
            self._changed = None
            self._missing.clear()
            return
        now = self._clock()
        gone = [f for f, t in self._mtimes.items() if math.isnan(current.get(f, math.nan))]
        self._missing = {
            f: self._missing.get(f, now) for f in gone if not math.isnan(self._mtimes[f])
        }
        if current != self._changed:
            self._changed = current  # still changing: read again at the next check
            return
        if self._missing and now - min(self._missing.values()) < MISSING_GRACE_S:
            return  # a file moved away for a moment comes back
        self._changed = None
        self._missing.clear()
        self._mtimes = current
        self.reload()
