"""What the API's routes answer: one pydantic model per JSON body, one module per resource
(``rules``, ``decisions``, ``quota``, ``engine``, ``audit``), built from the engine's values by
each model's ``of``. FastAPI serves them and describes them in the OpenAPI spec.

Used by ``gpuops.api.routes`` (and the console, which calls the route functions); request bodies
and the refusals every route shares are in ``gpuops.api.schemas``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema

Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
"""A JSON number as the engine holds it: an int stays an int, a float a float (``1`` is not
served as ``1.0``)."""

JsonObject = dict[str, JsonValue]
"""Free-form JSON: an action's ``params``, an outcome's ``changed``, an audit document."""


def _none(value: object) -> bool:
    return value is None


def _no_default(schema: dict[str, JsonValue]) -> None:
    schema.pop("default", None)


def absent_when_none() -> Any:
    """A field left out of the body while it is None (never served as ``null``): typed
    ``X | SkipJsonSchema[None]``, the spec shows it as an optional ``X``."""
    return Field(default=None, exclude_if=_none, json_schema_extra=_no_default)


class Out(BaseModel):
    """An answer: every key is declared (no extra), so a body and its schema cannot drift."""

    model_config = ConfigDict(extra="forbid")
