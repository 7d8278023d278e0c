"""Executor settings: the one way a settings model is read from the engine configuration and
a bad one is reported (``executors.<name> settings: key: what``).

Each executor declares its settings as a frozen pydantic model in its own module (``slurm``:
``SlurmSettings``...) and reads them with ``settings_of`` when it is built; ``problems`` also
words the params errors of the free-form executors (``command``, ``webhook``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def problems(exc: ValidationError) -> str:
    """Every error of ``exc`` as ``key: what``, joined by ``; `` (``(top)`` for the whole)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
    )


def settings_of(model: type[M], executor: str, settings: Mapping[str, Any] | None) -> M:
    """``settings`` (the engine configuration's ``executors.<executor>``) as ``model``;
    ``ValueError`` naming the executor and every problem."""
    try:
        return model.model_validate(dict(settings or {}))
    except ValidationError as exc:
        raise ValueError(f"executors.{executor} settings: {problems(exc)}") from None
