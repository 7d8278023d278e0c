"""What an executor hands back: a typed ``Result`` per outcome of a verb, and its JSON form.

Executors return a ``Result`` (``gpuops.actions.slurm.Reclaimed``, ``Answer`` for what a
remote service said it changed); ``gpuops.actions.base.execute`` turns it into the
``Outcome.changed`` mapping that the state database and the audit documents record (JSON, an
I/O edge). A result's fields are set explicitly when it is made: only those are in its JSON
form, in the order the model declares them (the form earlier outcomes recorded). A result is
also a read-only mapping of that form, so that the executor contract (``run`` returns a
mapping) holds for every executor, those of third parties (plain mappings) included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class Result(BaseModel, Mapping[str, Any]):
    """Base of executor results: frozen; ``changed`` is the JSON form, which it reads as."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def changed(self) -> dict[str, Any]:
        """The fields set when it was made, in declaration order."""
        return self.model_dump(exclude_unset=True)

    def __getitem__(self, key: str) -> Any:
        return self.changed()[key]

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        """The keys of the JSON form (a mapping's iteration, not pydantic's field pairs)."""
        return iter(self.changed())

    def __len__(self) -> int:
        return len(self.changed())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.changed() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class Answer(Result):
    """What a remote service answered that it changed (an HTTP body, kept as it came)."""

    document: dict[str, Any]

    def changed(self) -> dict[str, Any]:
        return dict(self.document)


class Logged(Result):
    """The ``log`` executor's: the action was recorded, nothing changed."""

    logged: bool


class Routed(Result):
    """A logical executor's (``scheduler``): the result of the concrete executor it handed the
    decision to, and that executor's name (unless the result names one itself)."""

    result: Mapping[str, Any]
    executor: str

    def changed(self) -> dict[str, Any]:
        out = dict(changes(self.result))
        out.setdefault("executor", self.executor)
        return out


ExecutorResult = Mapping[str, Any]
"""What ``Executor.run`` returns: a ``Result`` (a mapping), or a plain mapping."""


def changes(result: ExecutorResult) -> Mapping[str, Any]:
    """The JSON form of ``result`` (``Outcome.changed``)."""
    return result.changed() if isinstance(result, Result) else result
