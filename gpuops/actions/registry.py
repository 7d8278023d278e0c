"""The registry of executors: executor classes by name, loaded from the ``gpuops.executors``
entry points, and what each one does.

It builds executors and says which verbs each does and what params it takes, for the rule checks
(``gpuops.offline.rulecheck``): an executor's own ``check_params``, else, for a built-in executor
a verb of ``gpuops.model.verbs`` is checked for (``Verb.checked``), the verb's params model.
It never runs one: only ``gpuops.runtime.gate`` calls executors (``gpuops.actions.base.execute``),
so the engine's facade, the rulebook, the CLI and the API import this module, never ``base``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from gpuops.actions.base import Executor
from gpuops.model.verbs import VERBS

ENTRY_POINT_GROUP = "gpuops.executors"

ExecutorFactory = Callable[[Mapping[str, Any]], Executor]

LOGICAL_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "scheduler": {"use": "fleet", "by_verb": {"notify": "log"}},
    "gpu-control": {"use": "fleet"},
}
"""The logical executors (``gpuops.actions.logical``) and what each means when the engine
configuration does not say: the simulated fleet (which has no warning step of its own: ``notify``
is recorded by ``log``). Here, beside the registry, so that ``gpuops.settings`` completes their
settings without importing an executor."""


class ExecutorRegistry:
    """Executor classes by name. Each engine (and each test) gets its own registry."""

    def __init__(self) -> None:
        self._factories: dict[str, ExecutorFactory] = {}

    @classmethod
    def from_entry_points(cls) -> ExecutorRegistry:
        registry = cls()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            registry.register(ep.name, ep.load())
        return registry

    def register(self, name: str, factory: ExecutorFactory) -> None:
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def params_problems(self, executor: str, verb: str, params: Mapping[str, Any]) -> list[str]:
        """The problems of ``params`` for ``verb`` on ``executor``: its own ``check_params``
        when it has one; else, when ``executor`` is a built-in executor of the verb whose params
        ``gpuops.model.verbs`` says are checked before a decision (``Verb.checked``: the fleet's
        ``downclock`` and scaling, the node agent's ``downclock``), the verb's params model as
        that executor takes them. None otherwise: a free-form verb, an unknown executor, the
        logical ``scheduler`` and ``gpu-control``, a third-party executor without a
        ``check_params`` (even for a verb the table knows) — their params are refused, if at
        all, when the action runs."""
        factory = self._factories.get(executor)
        if factory is None:
            return []
        check = getattr(factory, "check_params", None)
        if check is not None:
            return list(check(verb, dict(params)))
        known = VERBS.get(verb)
        if known is None or executor not in known.checked:
            return []
        return known.check(params, executor)

    def verbs(self, name: str) -> frozenset[str] | None:
        """The verbs executor ``name`` declares (None: any verb, or an unknown executor)."""
        factory = self._factories.get(name)
        verbs = getattr(factory, "verbs", None)
        return verbs if isinstance(verbs, frozenset) else None

    def create(self, name: str, settings: Mapping[str, Any] | None = None) -> Executor:
        try:
            factory = self._factories[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise KeyError(f"unknown executor {name!r} (known: {known})") from None
        return factory(settings or {})
