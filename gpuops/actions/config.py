"""Executor settings: the one way a settings model is read from the engine configuration and
a bad one is reported (``executors.<name> settings: key: what``).

Each executor declares its settings as a frozen pydantic model in its own module (``slurm``:
``SlurmSettings``...) and reads them with ``settings_of`` when it is built (the engine builds
every configured executor at its start and does not start on a bad setting,
``gpuops.runtime.gate``); a file of secrets its settings name is read by ``read_secret``
(``SecretFileError`` when it cannot be);
``problems`` also words the params errors of the free-form executors (``command``,
``webhook``). ``as_text`` is the conversion the executors always made of a text setting;
``null_is_default`` reads a null setting as left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def as_text(value: Any) -> str | None:
    """``str()`` of what was given (``url: 5``, ``token: 123456``, ``gpu_label: 0`` are text, as
    they always were); null stays null (refused where the setting takes text)."""
    return None if value is None else str(value)


def null_is_default(settings: Any) -> Any:
    """``settings`` without the keys given as null: each takes its default, as everywhere in the
    engine configuration (``url: null`` is the default URL)."""
    if isinstance(settings, Mapping):
        return {key: value for key, value in settings.items() if value is not None}
    return settings


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


class SecretFileError(OSError):
    """A file of secrets an executor's settings name (a token) cannot be read here; the
    message names the executor, the key and the file."""


def read_secret(executor: str, key: str, path: Path) -> str:
    """The first line of ``path`` (stripped; empty for an empty file), the file named by
    ``executors.<executor>.<key>``; ``SecretFileError`` saying why it cannot be read."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SecretFileError(
            f"executors.{executor} settings: {key}: {str(path)!r} cannot be read: {why}"
        ) from None
    return lines[0].strip() if lines else ""
