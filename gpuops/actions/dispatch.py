"""An executor's dispatch table: each verb it implements (``gpuops.model.verbs``) to its handler.

The executors of the table's verbs (``fleet``, ``slurm``, ``nvml-agent``) build one ``Dispatch``
of ``on(VERB, handler)`` routes when their module is imported; it checks that they route exactly
the verbs the table says they implement (so the table and the executors cannot drift apart),
gives the executor its ``verbs``, and in ``run`` parses the decision's params with the verb's
model, as that executor takes them (``Verb.parse(params, executor)``), and calls the handler with
them, typed. Bad params are a ``PermanentError`` saying the first problem. A route's ``first``
checks what the executor reads before its params (a target label): a decision with both wrong
fails with that problem, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from gpuops.actions.base import PermanentError
from gpuops.model.decisions import Decision
from gpuops.model.verbs import ParamsError, Verb, VerbParams, implemented_by

E = TypeVar("E")
"""The executor class whose methods the handlers are."""
R = TypeVar("R")
"""What the handlers return."""
P = TypeVar("P", bound=VerbParams)


@dataclass(frozen=True)
class Route(Generic[E, R]):
    verb: Verb[Any]
    handler: Callable[[E, Decision, Any], R]
    first: Callable[[Decision], object] | None = None


def on(
    verb: Verb[P],
    handler: Callable[[E, Decision, P], R],
    first: Callable[[Decision], object] | None = None,
) -> Route[E, R]:
    """Route ``verb`` to ``handler(executor, decision, params)``, ``params`` of its model;
    ``first(decision)``, when given, runs before the params are parsed (it raises
    ``PermanentError`` for what the executor checks before them)."""
    return Route(verb, handler, first)


class Dispatch(Generic[E, R]):
    """The routes of executor ``name``, by verb."""

    def __init__(self, name: str, routes: Iterable[Route[E, R]]) -> None:
        table: dict[str, Route[E, R]] = {}
        for route in routes:
            if route.verb.name in table:
                raise TypeError(f"executor {name!r} routes {route.verb.name!r} twice")
            table[route.verb.name] = route
        declared = implemented_by(name)
        if table.keys() != declared:
            raise TypeError(
                f"executor {name!r} routes {sorted(table)}, but gpuops.model.verbs says it "
                f"implements {sorted(declared)}"
            )
        self.name = name
        self.routes: Mapping[str, Route[E, R]] = MappingProxyType(table)
        self.verbs = frozenset(table)

    def run(self, executor: E, decision: Decision) -> R:
        """Hand ``decision`` to the handler of its verb, with its params parsed."""
        verb = decision.action.type if decision.action is not None else ""
        route = self.routes.get(verb)
        if route is None or decision.action is None:
            raise PermanentError(f"{self.name} does not support action {verb!r}")
        if route.first is not None:
            route.first(decision)
        try:
            params = route.verb.parse(decision.action.params, self.name)
        except ParamsError as exc:
            raise PermanentError(exc.problems[0]) from None
        return route.handler(executor, decision, params)
