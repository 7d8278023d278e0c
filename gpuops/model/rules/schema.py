"""The raw schema of a rule file as pydantic models, ``extra="forbid"``.

``gpuops.model.rules.loader`` validates each level of a parsed file with these models and turns the
result into the frozen values of ``gpuops.model.rules.model``. Field validators raise
``PydanticCustomError``s whose messages already say what was found and what is allowed; the
loader adds file, line and key.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any

from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from gpuops.model.rules import templating
from gpuops.model.rules.durations import DurationError, parse_duration

LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
POLICY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


def describe(value: Any) -> str:
    """How a found value is shown in a message: ``"10 minutes"``, ``5 (integer)``, ``a list``."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (boolean; quote it if you meant a string)"
    if isinstance(value, int):
        return f"{value} (integer)"
    if isinstance(value, float):
        return f"{value} (number)"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return type(value).__name__


def suggest(found: Any, allowed: Sequence[str]) -> str:
    """``, did you mean "enforce"?`` when ``found`` is close to one of ``allowed``, else ``""``."""
    close = difflib.get_close_matches(found, allowed, n=1) if isinstance(found, str) else []
    return f', did you mean "{close[0]}"?' if close else ""


def fail(kind: str, message: str) -> PydanticCustomError:
    # Passed as context so that braces in user input are not read as message placeholders.
    return PydanticCustomError(kind, "{message}", {"message": message})


def _duration(value: Any) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except DurationError:
            pass
    raise fail(
        "duration",
        f"invalid duration {describe(value)} (expected a Prometheus duration such as 30s, 5m, 1h)",
    )


def _positive_duration(value: Any) -> float:
    seconds = _duration(value)
    if seconds <= 0:
        raise fail("duration", f"duration must be longer than 0, found {describe(value)}")
    return seconds


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise fail("string", f"expected a string, found {describe(value)}")
    return value


def _non_empty(value: Any) -> str:
    text = _text(value)
    if not text.strip():
        raise fail("string", "must not be empty")
    return text


def _label_name(value: Any) -> str:
    name = _text(value)
    if not LABEL_NAME.fullmatch(name):
        raise fail(
            "label_name",
            f"invalid label name {describe(value)} (allowed: letters, digits and _, "
            "not starting with a digit)",
        )
    return name


def _policy_name(value: Any) -> str:
    name = _non_empty(value)
    if not POLICY_NAME.fullmatch(name):
        raise fail(
            "policy_name",
            f"invalid policy name {describe(value)} (allowed: letters, digits, -, _ and ., "
            "starting with a letter)",
        )
    return name


def choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in allowed:
            raise fail(
                "choice",
                f"invalid value {describe(value)}{suggest(value, allowed)} "
                f"(allowed: {', '.join(allowed)})",
            )
        return str(value)

    return check


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise fail(
            "fraction",
            f"invalid fraction {describe(value)} (allowed: a number greater than 0 and at most "
            "1, such as 0.25)",
        )
    return float(value)


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(
            "positive_int", f"invalid count {describe(value)} (allowed: a whole number >= 1)"
        )
    return value


def _cron(value: Any) -> str:
    text = _non_empty(value)
    if len(text.split()) != 5:
        raise fail(
            "cron",
            f"invalid schedule {describe(value)} (expected 5 cron fields: minute hour "
            'day-of-month month day-of-week, such as "*/5 22-23,0-5 * * *")',
        )
    try:
        CronTrigger.from_crontab(text)
    except ValueError as exc:
        raise fail("cron", f"invalid schedule {describe(value)} ({exc})") from None
    return text


def _unique_labels(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise fail("list", f"expected a list of label names, found {describe(value)}")
    if not value:
        raise fail("list", "must name at least one label (omit target to use all labels)")
    names = [_label_name(v) for v in value]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise fail("list", f"label {json.dumps(repeated[0])} is named more than once")
    return names


def template_problem(template: str) -> str | None:
    """What is wrong with a ``{{ $labels.x }}`` / ``{{ $value }}`` template, or None."""
    allowed = "(allowed: {{ $labels.NAME }} and {{ $value }})"
    unknown = templating.unknown_placeholders(template)
    if unknown:
        return f"unknown template placeholder {json.dumps(unknown[0])} {allowed}"
    rest = templating.ANY_BRACES.sub("", template)
    if "{{" in rest or "}}" in rest:
        return f"unbalanced template braces in {json.dumps(template)} {allowed}"
    return None


def _template(value: Any) -> str:
    text = _text(value)
    problem = template_problem(text)
    if problem:
        raise fail("template", problem)
    return text


Duration = Annotated[float, BeforeValidator(_duration)]
PositiveDuration = Annotated[float, BeforeValidator(_positive_duration)]
Text = Annotated[str, BeforeValidator(_text)]
NonEmpty = Annotated[str, BeforeValidator(_non_empty)]
LabelName = Annotated[str, BeforeValidator(_label_name)]
Template = Annotated[str, BeforeValidator(_template)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActionModel(_Strict):
    """``action`` and ``on_clear``: verb, executor name, parameters for the executor."""

    type: NonEmpty
    executor: NonEmpty
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, value: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("executors")
        if known is not None and value not in known:
            raise fail(
                "executor",
                f"unknown executor {describe(value)}{suggest(value, known)} "
                f"(allowed: {', '.join(known)})",
            )
        return value


class LimitsModel(_Strict):
    """Blast radius of one policy."""

    max_per_hour: Annotated[int, BeforeValidator(_positive_int)] | None = None
    max_fraction: Annotated[float, BeforeValidator(_fraction)] | None = None
    population: NonEmpty | None = None
    """PromQL whose series count ``max_fraction`` is a fraction of (default: see Policy)."""


class TriggerModel(_Strict):
    """Alert labels that trigger a policy through the Alertmanager webhook."""

    alertmanager: dict[LabelName, Text] = Field(min_length=1)


class RuleModel(_Strict):
    """One policy (a rule of a group)."""

    policy: Annotated[str, BeforeValidator(_policy_name)]
    description: Text = ""
    expr: NonEmpty | None = None
    for_: Duration = Field(0.0, alias="for")
    keep_firing_for: Duration = 0.0
    clear_expr: NonEmpty | None = None
    target: Annotated[list[str], BeforeValidator(_unique_labels)] | None = None
    action: ActionModel
    on_clear: ActionModel | None = None
    cooldown: Duration = 0.0
    repeat_interval: PositiveDuration | None = None
    limits: LimitsModel | None = None
    mode: Annotated[str, BeforeValidator(choice("enforce", "dry-run"))] = "dry-run"
    on_no_data: Annotated[str, BeforeValidator(choice("hold", "skip"))] = "hold"
    approval: Annotated[str, BeforeValidator(choice("none", "required"))] = "none"
    schedule: Annotated[str, BeforeValidator(_cron)] | None = None
    trigger: TriggerModel | None = None
    labels: dict[LabelName, Template] = Field(default_factory=dict)
    annotations: dict[LabelName, Template] = Field(default_factory=dict)


class GroupModel(_Strict):
    """A group: its name, its evaluation interval, its rules (validated one by one)."""

    name: NonEmpty
    interval: PositiveDuration = 30.0
    max_sample_age: PositiveDuration | None = None
    """Overrides the engine's ``prometheus.max_sample_age`` for this group (e.g. for policies
    over recording rules, whose samples are as old as their evaluation interval)."""
    rules: list[Any]


class FileModel(_Strict):
    """A rule file: a mapping with a list of groups (validated one by one)."""

    groups: list[Any]


NESTED: Mapping[str, type[BaseModel]] = MappingProxyType(
    {"action": ActionModel, "on_clear": ActionModel, "limits": LimitsModel, "trigger": TriggerModel}
)
"""Models of the nested mappings of a rule, by key (for "allowed keys" in messages)."""


def allowed_keys(model: type[BaseModel]) -> list[str]:
    """The keys a mapping validated by ``model`` may have, sorted."""
    return sorted(f.alias or name for name, f in model.model_fields.items())
