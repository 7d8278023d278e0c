"""Reads rule files into a ``RuleSet``, or raises ``RulesError`` with every problem found.

Called by ``gpuops.runtime`` (start and reload), ``gpuops rules check|export|test`` and the API.
It only reads and validates: installing, reloading and keeping the last valid rule set are the
runtime's business. Parsing keeps line numbers (``yamlsource``), the schema is pydantic
(``schema``), messages are ``file:line: key: what was found (what is allowed)`` (``messages``).
PromQL itself is checked by ``gpuops.offline.promtool`` with a real parser.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuops.model.decisions import ActionSpec, freeze
from gpuops.model.rules.messages import format_path, from_validation, from_yaml, located
from gpuops.model.rules.model import MAX_COOLDOWN_S, Group, Policy, RuleError, RulesError, RuleSet
from gpuops.model.rules.schema import (
    NESTED,
    ActionModel,
    FileModel,
    GroupModel,
    RuleModel,
    describe,
    template_problem,
)
from gpuops.model.rules.yamlsource import Positions, YamlLimits, YamlPath, parse_yaml

log = logging.getLogger(__name__)

BUILTIN_EXECUTORS = ("command", "fleet", "log", "nvml-agent", "webhook")
EXECUTOR_ENTRY_POINTS = "gpuops.executors"
RESERVED_LABELS = ("gpuops_policy",)


def known_executors() -> list[str]:
    """Built-in executor names plus those registered under the ``gpuops.executors`` entry point."""
    names = set(BUILTIN_EXECUTORS)
    names.update(ep.name for ep in entry_points(group=EXECUTOR_ENTRY_POINTS))
    return sorted(names)


def rule_files(paths: Sequence[Path | str]) -> tuple[list[Path], list[RuleError]]:
    """The files named by ``paths``: files as given, directories as their ``*.yaml``/``*.yml``
    (not recursive, sorted by name). A missing path or an empty directory is an error (whose
    ``file`` is the path as given, so errors sort in the order of ``paths``)."""
    files: list[Path] = []
    errors: list[RuleError] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()
            )
            if not found:
                errors.append(RuleError(str(path), 0, "no rule files (*.yaml, *.yml) in directory"))
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            errors.append(RuleError(str(path), 0, "cannot read: no such file or directory"))
    return files, errors


def load_rules(paths: Sequence[Path | str]) -> RuleSet:
    """Load and validate the rule files at ``paths`` (files or directories) as one rule set."""
    files, errors = rule_files(paths)
    texts: list[tuple[str, str]] = []
    limit = YamlLimits().max_bytes
    for path in files:
        try:
            if path.stat().st_size > limit:  # not even read: its size is enough to refuse it
                size = path.stat().st_size
                message = f"file of {size} bytes is larger than the limit of {limit} bytes"
                errors.append(RuleError(str(path), 1, message))
                continue
            texts.append((path.read_text(encoding="utf-8"), str(path)))
        except UnicodeDecodeError:
            errors.append(RuleError(str(path), 0, "cannot read: not UTF-8 text"))
        except OSError as exc:
            errors.append(RuleError(str(path), 0, f"cannot read: {exc.strerror or exc}"))
    order = [str(p) for p in files] + [e.file for e in errors]
    return _load(texts, errors, sorted(order, key=_given_order(paths)))


def _given_order(paths: Sequence[Path | str]) -> Callable[[str], int]:
    given = [Path(p) for p in paths]

    def rank(name: str) -> int:
        path = Path(name)
        return next((i for i, p in enumerate(given) if p == path or p == path.parent), len(given))

    return rank


def load_rules_text(text: str, filename: str) -> RuleSet:
    """Load and validate one rule file given as text (``filename`` is used in messages)."""
    return _load([(text, filename)], [], [filename])


def _load(texts: list[tuple[str, str]], errors: list[RuleError], order: list[str]) -> RuleSet:
    """Validate ``texts`` (text, file name); errors are sorted by ``order`` of files, then line."""
    groups: list[Group] = []
    names: list[_Name] = []
    context = {"executors": known_executors()}
    for text, filename in texts:
        reader = _FileReader(filename, context)
        groups.extend(reader.read(text))
        errors.extend(reader.errors)
        names.extend(reader.names)
    errors.extend(_duplicates(names))
    if errors:
        rank = {name: index for index, name in reversed(list(enumerate(order)))}
        raise RulesError(sorted(errors, key=lambda e: (rank.get(e.file, len(rank)), e.line)))
    ruleset = RuleSet(groups=tuple(groups), files=tuple(name for _, name in texts))
    log.debug("loaded %d policies from %d files", sum(1 for _ in ruleset.policies()), len(texts))
    return ruleset


@dataclass(frozen=True)
class _Name:
    """A group or policy name as written, valid or not (for uniqueness across files)."""

    kind: str
    name: str
    file: str
    line: int
    path: YamlPath


def _duplicates(names: list[_Name]) -> list[RuleError]:
    errors: list[RuleError] = []
    first: dict[tuple[str, str], _Name] = {}
    for name in names:
        seen = first.setdefault((name.kind, name.name), name)
        if seen is not name:
            message = (
                f"duplicate {name.kind} name {json.dumps(name.name)} (first defined at "
                f"{seen.file}:{seen.line}; {name.kind} names must be unique across the rule set)"
            )
            errors.append(located(name.file, name.line, name.path, message))
    return errors


@dataclass
class _FileReader:
    """Validates one file level by level, so that one bad rule hides no error of another."""

    file: str
    context: dict[str, Any]
    """Validation context for the schema (``executors``: the known executor names)."""

    def __post_init__(self) -> None:
        self.errors: list[RuleError] = []
        self.names: list[_Name] = []
        self.positions = Positions()

    def read(self, text: str) -> list[Group]:
        data, self.positions, problems = parse_yaml(text)
        self.errors.extend(from_yaml(self.file, p) for p in problems)
        if problems and data is None:
            return []
        if data is None:
            self.errors.append(
                RuleError(self.file, 1, 'file is empty (expected a mapping with a "groups" list)')
            )
            return []
        if not isinstance(data, dict):
            found = describe(data)
            message = f'expected a mapping with a "groups" list, found {found}'
            self.errors.append(RuleError(self.file, self.positions.value_line(()), message))
            return []
        self._validate(FileModel, data, ())
        raw_groups = data.get("groups")
        return self._groups(raw_groups) if isinstance(raw_groups, list) else []

    def _validate(self, model: type[BaseModel], data: Any, path: YamlPath) -> Any:
        try:
            return model.model_validate(data, context=self.context)
        except ValidationError as exc:
            self.errors.extend(from_validation(self.file, path, exc, model, self.positions, NESTED))
            return None

    def _remember(self, kind: str, raw: Any, path: YamlPath) -> None:
        name = raw.get(path[-1]) if isinstance(raw, dict) else None
        if isinstance(name, str):
            self.names.append(_Name(kind, name, self.file, self.positions.line(path), path))

    def _error(self, path: YamlPath, message: str, value_line: bool = False) -> None:
        line = self.positions.value_line(path) if value_line else self.positions.line(path)
        self.errors.append(located(self.file, line, path, message))

    def _groups(self, raw_groups: list[Any]) -> list[Group]:
        groups = []
        for index, raw in enumerate(raw_groups):
            path: YamlPath = ("groups", index)
            model = self._validate(GroupModel, raw, path)
            self._remember("group", raw, (*path, "name"))
            rules = raw.get("rules") if isinstance(raw, dict) else None
            name = model.name if model is not None else ""
            policies = []
            for rule_index, rule in enumerate(rules if isinstance(rules, list) else []):
                policy = self._policy(rule, (*path, "rules", rule_index), name)
                if policy is not None:
                    policies.append(policy)
            if model is not None:
                source = f"{self.file}:{self.positions.line((*path, 'name'))}"
                groups.append(
                    Group(
                        model.name,
                        model.interval,
                        tuple(policies),
                        source,
                        max_sample_age_s=model.max_sample_age,
                    )
                )
        return groups

    def _policy(self, raw: Any, path: YamlPath, group: str) -> Policy | None:
        model = self._validate(RuleModel, raw, path)
        self._remember("policy", raw, (*path, "policy"))
        if model is None:
            return None
        before = len(self.errors)
        self._check_rule(model, path)
        if len(self.errors) > before:
            return None
        limits = model.limits
        return Policy(
            name=model.policy,
            group=group,
            expr=model.expr.strip() if model.expr else None,
            action=_action(model.action),
            description=model.description.strip(),
            for_s=model.for_,
            keep_firing_for_s=model.keep_firing_for,
            clear_expr=model.clear_expr.strip() if model.clear_expr else None,
            target=tuple(model.target) if model.target else None,
            on_clear=_action(model.on_clear) if model.on_clear else None,
            cooldown_s=model.cooldown,
            repeat_interval_s=model.repeat_interval,
            max_per_hour=limits.max_per_hour if limits else None,
            max_fraction=limits.max_fraction if limits else None,
            population=limits.population.strip() if limits and limits.population else None,
            mode=model.mode,
            on_no_data=model.on_no_data,
            approval=model.approval,
            schedule=model.schedule,
            trigger_alertmanager=freeze(model.trigger.alertmanager) if model.trigger else None,
            labels=freeze(model.labels),
            annotations=freeze(model.annotations),
            source=f"{self.file}:{self.positions.value_line(path)}",
            path=format_path(path),
            key_lines=freeze(self.positions.key_lines(path)),
        )

    def _check_rule(self, model: RuleModel, path: YamlPath) -> None:
        """What one field alone cannot say: combinations, executors, templates."""
        if model.expr is None and model.trigger is None:
            self._error(
                path,
                f"policy {json.dumps(model.policy)} has neither expr nor trigger.alertmanager "
                "(a policy needs at least one of them)",
                value_line=True,
            )
        if model.expr is None:
            # on_clear stays allowed: a resolved Alertmanager alert runs it
            for key in ("clear_expr", "schedule", "keep_firing_for"):
                if key in model.model_fields_set:
                    self._error((*path, key), f"{key} needs an expr (this policy has none)")
        if model.schedule is not None:
            for field_name, key in (("for_", "for"), ("keep_firing_for", "keep_firing_for")):
                if field_name in model.model_fields_set:
                    self._error(
                        (*path, key),
                        f"{key} needs continuous evaluation, but a policy with a schedule is "
                        "evaluated only at its cron times (remove it; use repeat_interval to act "
                        "again while the condition holds)",
                    )
        if model.cooldown > MAX_COOLDOWN_S:
            self._error(
                (*path, "cooldown"),
                f"cooldown of {model.cooldown / 86400:g}d is longer than the guardrails remember "
                f"the last action on a target ({MAX_COOLDOWN_S / 86400:g}d): it would end early "
                "(use at most 30d)",
            )
        if model.limits and model.limits.population and model.limits.max_fraction is None:
            self._error(
                (*path, "limits", "population"),
                "population is only used with max_fraction (add limits.max_fraction)",
            )
        for key in ("action", "on_clear"):
            action = getattr(model, key)
            if action is not None:
                self._check_templates((*path, key, "params"), action.params)
        for name in model.labels:
            if name.startswith("__") or name in RESERVED_LABELS:
                self._error(
                    (*path, "labels", name),
                    f"label name {json.dumps(name)} is reserved (gpuops or Prometheus sets it)",
                )

    def _check_templates(self, path: YamlPath, value: Any) -> None:
        """The templates in an action's params, and that the params are JSON's own types: a
        decision is stored and audited as JSON, and a value JSON has no type for (a YAML
        date, ``2024-01-01`` unquoted; ``.nan``; a key that is not text) would fail every
        decision of the policy when it is recorded or sent, at run time, or come back
        changed after a restart."""
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    line = self.positions.line((*path, key))
                    self.errors.append(
                        located(
                            self.file,
                            line,
                            path,
                            f"a key that is {_yaml_kind(key)}: params keys are text (JSON's "
                            "object keys); quote it",
                        )
                    )
                    continue
                self._check_templates((*path, key), item)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self._check_templates((*path, index), item)
        elif isinstance(value, str):
            message = template_problem(value)
            if message:
                self._error(path, message)
        elif isinstance(value, float) and not math.isfinite(value):
            self._error(
                path,
                f"{_yaml_kind(value)} is no number JSON can hold (decisions are stored, audited "
                "and sent as JSON); quote it to pass the text",
                value_line=True,
            )
        elif value is not None and not isinstance(value, bool | int | float):
            self._error(
                path,
                f"{_yaml_kind(value)} is no type JSON has (decisions are stored, audited and "
                "sent as JSON); quote it to pass the text",
                value_line=True,
            )


def _yaml_kind(value: Any) -> str:
    """What YAML made of an unquoted value, in YAML's words (``_check_templates``)."""
    if isinstance(value, datetime):
        return f"a timestamp ({value.isoformat()})"
    if isinstance(value, date):
        return f"a date ({value.isoformat()})"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if value != value else (".inf" if value > 0 else "-.inf")
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    tags: dict[type, str] = {set: "!!set", bytes: "!!binary", tuple: "!!omap or !!pairs"}
    tag = tags.get(type(value))
    return f"a {tag} value" if tag else f"a {type(value).__name__}"


def _action(model: ActionModel) -> ActionSpec:
    return ActionSpec(type=model.type, executor=model.executor, params=freeze(model.params))
