"""Logical executors: names that policies use for *what* they act on, mapped by the engine
configuration to the concrete executor of a site. The shipped policies
name them, so the same rule files run on the simulated fleet and on a Slurm cluster:

- ``scheduler``: reclaim, migrate/resume, scale out/in, notify — ``fleet`` or ``slurm``;
- ``gpu-control``: downclock / restore clocks — ``fleet`` or ``nvml-agent``.

``gpuops.settings`` fills their settings (``use``, ``by_verb``, and the settings of each concrete
executor they may call); ``gpuops.actions.base.execute`` calls ``run`` like any executor's, and
the concrete executor's verbs, errors and idempotency apply unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from gpuops.actions.base import Executor, PermanentError, lane, standing
from gpuops.actions.config import settings_of
from gpuops.actions.registry import LOGICAL_DEFAULTS, ExecutorRegistry
from gpuops.actions.results import Routed
from gpuops.model.decisions import Decision
from gpuops.model.guardrails import Standing


def _name(value: Any) -> str | None:
    """An executor's name: ``str()`` of what was given; empty or null: none."""
    return str(value) if value else None


def _by_verb(value: Any) -> Any:
    """Verb to executor name, each ``str()`` of what was given (``notify: 5`` names ``'5'``,
    which no executor is)."""
    if not value:
        return None
    if not isinstance(value, Mapping):
        return value  # refused: not a mapping
    return {str(verb): str(name) for verb, name in value.items()}


def _concrete(value: Any) -> Any:
    """Each concrete executor's settings; an empty value (``fleet: []``) is none."""
    if not value or not isinstance(value, Mapping):
        return value or None
    return {name: settings or None for name, settings in value.items()}


class LogicalSettings(BaseModel):
    """``executors.scheduler`` (``gpu-control``) as ``gpuops.settings`` completes it (its
    names are text, as they always were)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    use: Annotated[str | None, BeforeValidator(_name)] = None
    """The concrete executor it maps to."""
    by_verb: Annotated[dict[str, str] | None, BeforeValidator(_by_verb)] = None
    """Verbs mapped to another concrete executor (``notify: log``)."""
    settings: Annotated[dict[str, dict[str, Any] | None] | None, BeforeValidator(_concrete)] = None
    """The settings of each concrete executor it may call."""


class LogicalExecutor:
    """Hands each decision to the concrete executor its verb maps to."""

    name = "logical"
    verbs: frozenset[str] | None = None  # the concrete executor checks its own

    def __init__(
        self, settings: Mapping[str, Any] | None = None, registry: ExecutorRegistry | None = None
    ) -> None:
        mapping = settings_of(LogicalSettings, self.name, settings)
        self.use = mapping.use or ""
        if not self.use:
            raise ValueError(f"executors.{self.name}.use: name the executor it maps to")
        self.by_verb = dict(mapping.by_verb or {})
        concrete = dict(mapping.settings or {})
        registry = registry or ExecutorRegistry.from_entry_points()
        self._executors: dict[str, Executor] = {}
        for name in {self.use, *self.by_verb.values()}:
            if name in LOGICAL_DEFAULTS:
                concrete_names = [n for n in registry.names() if n not in LOGICAL_DEFAULTS]
                raise ValueError(
                    f"executors.{self.name}: {name!r} is itself logical; map to a concrete "
                    f"executor ({', '.join(concrete_names)})"
                )
            self._executors[name] = registry.create(name, concrete.get(name))
        target = self._executors[self.use]
        self.verbs = None if target.verbs is None else target.verbs | set(self.by_verb)

    def executor_for(self, verb: str) -> Executor:
        return self._executors[self.by_verb.get(verb, self.use)]

    def lane(self, decision: Decision) -> str:
        """The lane the concrete executor of ``decision``'s verb gives it (``base.lane``)."""
        verb = decision.action.type if decision.action else ""
        return lane(self.executor_for(verb), decision)

    def standing(self, decision: Decision) -> Standing | None:
        """The standing the concrete executor of ``decision``'s verb reads (``base.standing``)."""
        verb = decision.action.type if decision.action else ""
        return standing(self.executor_for(verb), decision)

    def run(self, decision: Decision) -> Routed:
        verb = decision.action.type if decision.action else ""
        executor = self.executor_for(verb)
        if executor.verbs is not None and verb not in executor.verbs:
            raise PermanentError(
                f"{self.name} maps {verb!r} to {executor.name!r}, which does not do it "
                f"(it does: {', '.join(sorted(executor.verbs))})"
            )
        return Routed(result=executor.run(decision), executor=executor.name)


class SchedulerExecutor(LogicalExecutor):
    name = "scheduler"


class GpuControlExecutor(LogicalExecutor):
    name = "gpu-control"
