"""Turns validation problems into ``RuleError``s that name file, line and key.

Called by ``gpuops.model.rules.loader`` (and ``gpuops.model.rules.testspec``) with pydantic's
errors and the
positions recorded while parsing; produces ``file:line: groups[0].rules[1].for: message``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuops.model.rules.model import RuleError
from gpuops.model.rules.schema import allowed_keys, describe, suggest
from gpuops.model.rules.yamlsource import Positions, YamlPath, YamlProblem

_EXPECTED = {
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}


def format_path(path: YamlPath) -> str:
    """``("groups", 0, "rules", 1, "for")`` → ``groups[0].rules[1].for``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def located(file: str, line: int, path: YamlPath, message: str) -> RuleError:
    """A ``RuleError`` whose message starts with the key it is about."""
    where = format_path(path)
    return RuleError(file, line, f"{where}: {message}" if where else message)


def from_yaml(file: str, problem: YamlProblem) -> RuleError:
    return located(file, problem.line, problem.path, problem.message)


def unknown_key(key: str, allowed: list[str]) -> str:
    """``unknown key "cooldwn", did you mean "cooldown"? (allowed: a, b)``."""
    return f"unknown key {json.dumps(key)}{suggest(key, allowed)} (allowed: {', '.join(allowed)})"


def _model_at(
    model: type[BaseModel], loc: YamlPath, nested: Mapping[str, type[BaseModel]]
) -> type[BaseModel]:
    current = model
    for part in loc:
        if isinstance(part, str) and part in nested:
            current = nested[part]
    return current


def from_validation(
    file: str,
    base: YamlPath,
    exc: ValidationError,
    model: type[BaseModel],
    positions: Positions,
    nested: Mapping[str, type[BaseModel]] | None = None,
) -> list[RuleError]:
    """One ``RuleError`` per pydantic error of validating the data at ``base`` with ``model``."""
    errors = []
    for err in exc.errors():
        loc: YamlPath = tuple(p for p in err["loc"] if p != "[key]")
        path = (*base, *loc)
        errors.append(_one(file, path, loc, err, model, positions, nested or {}))
    return errors


def _one(
    file: str,
    path: YamlPath,
    loc: YamlPath,
    err: Any,
    model: type[BaseModel],
    positions: Positions,
    nested: Mapping[str, type[BaseModel]],
) -> RuleError:
    kind = err["type"]
    found = err.get("input")
    if kind == "extra_forbidden":
        allowed = allowed_keys(_model_at(model, loc[:-1], nested))
        return located(file, positions.line(path), path[:-1], unknown_key(str(path[-1]), allowed))
    if kind == "missing":
        parent = path[:-1]
        message = f"missing required key {json.dumps(str(path[-1]))}"
        return located(file, positions.value_line(parent), parent, message)
    if kind in _EXPECTED:
        message = f"expected {_EXPECTED[kind]}, found {describe(found)}"
    elif kind == "too_short":
        message = "must not be empty"
    else:
        message = str(err["msg"])
    return located(file, positions.line(path), path, message)
