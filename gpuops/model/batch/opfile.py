"""An operation file to an ``Operation``, every problem as ``FILE:LINE: field: what``.

Read with the rule files' YAML reader (``gpuops.model.rules.yamlsource``: lines, duplicate keys,
limits) and their error type, so ``gpuops batch plan`` prints problems as ``gpuops rules check``
does. Paths in the file (the playbook, the inventory) are relative to the file's folder; a
missing one is refused here, before anything runs. Called by ``gpuops.cli.batch`` and the
engine's batch runner.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuops.model.batch.operation import (
    SKIP_LABEL,
    Budget,
    OnStop,
    Operation,
    Step,
    StepKind,
    Targets,
    Timing,
    Validation,
)
from gpuops.model.rules.durations import DurationError, parse_duration
from gpuops.model.rules.messages import from_yaml, located, unknown_key
from gpuops.model.rules.model import RuleError, RulesError
from gpuops.model.rules.schema import describe, suggest
from gpuops.model.rules.yamlsource import Positions, YamlPath, parse_yaml

_TOP = (
    "approval",
    "canary",
    "enforce",
    "failure_threshold",
    "max_parallel",
    "max_unavailable",
    "on_stop",
    "operation",
    "quarantine",
    "reboot",
    "skip_label",
    "step",
    "targets",
    "timing",
    "validate",
)
_TARGETS = ("all", "features", "labels", "nodes", "pool")
_STEPS = tuple(k.value for k in StepKind)
_STEP = (*_STEPS, "extra_vars", "inventory", "timeout")
_VALIDATE = ("command", "timeout")
_TIMING = ("quarantine", "reboot", "return", "step", "validate")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


class _Reader:
    """Reads one operation file, collecting every problem with its line."""

    def __init__(self, file: str, positions: Positions) -> None:
        self.file = file
        self.positions = positions
        self.errors: list[RuleError] = []

    def fail(self, path: YamlPath, message: str) -> None:
        self.errors.append(located(self.file, self.positions.value_line(path), path, message))

    def mapping(self, data: Any, path: YamlPath, allowed: Sequence[str]) -> Mapping[str, Any]:
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping, found {describe(data)}")
            return {}
        for key in data:
            if key not in allowed:
                line = self.positions.line((*path, str(key)))
                where = (*path, str(key))
                self.errors.append(
                    located(self.file, line, where, unknown_key(str(key), sorted(allowed)))
                )
        return data

    def whole(self, data: Mapping[str, Any], key: str, default: int, least: int) -> int:
        value = data.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            self.fail(
                (key,), f"expected a whole number of at least {least}, found {describe(value)}"
            )
            return default
        return value

    def flag(self, data: Mapping[str, Any], path: YamlPath, default: bool) -> bool:
        value = data.get(str(path[-1]), default)
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, found {describe(value)}")
            return default
        return value

    def seconds(self, value: Any, path: YamlPath, default: float) -> float:
        if value is None:
            return default
        if isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except DurationError:
                seconds = -1.0
            if seconds > 0:
                return seconds
        self.fail(path, f"expected a duration above 0 such as 90s or 10m, found {describe(value)}")
        return default

    def names(self, value: Any, path: YamlPath) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            self.fail(path, f"expected a list of names, found {describe(value)}")
            return ()
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                self.fail((*path, i), f"expected a name, found {describe(item)}")
            else:
                out.append(item)
        return tuple(out)

    def argv(self, value: Any, path: YamlPath) -> tuple[str, ...]:
        if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
            self.fail(
                path,
                f"expected a command as a list of arguments (argv, no shell), found"
                f" {describe(value)}",
            )
            return ()
        return tuple(value)

    def text_map(self, value: Any, path: YamlPath) -> dict[str, str]:
        data = self.mapping(value, path, ()) if not isinstance(value, dict) else value
        out = {}
        for key, item in data.items():
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                self.fail((*path, str(key)), f"expected a string or number, found {describe(item)}")
            else:
                out[str(key)] = str(item)
        return out


def _targets(reader: _Reader, data: Any) -> Targets:
    path: YamlPath = ("targets",)
    if data is None:
        reader.fail(path, "missing: name nodes, or a pool, features or labels (or all: true)")
        return Targets()
    given = reader.mapping(data, path, _TARGETS)
    nodes = reader.names(given["nodes"], (*path, "nodes")) if "nodes" in given else ()
    pool = given.get("pool")
    if pool is not None and not isinstance(pool, str):
        reader.fail((*path, "pool"), f"expected a pool name, found {describe(pool)}")
        pool = None
    features = reader.names(given["features"], (*path, "features")) if "features" in given else ()
    labels = reader.text_map(given["labels"], (*path, "labels")) if "labels" in given else {}
    everything = reader.flag(given, (*path, "all"), False)
    if nodes and (pool is not None or features or labels or everything):
        reader.fail(path, "nodes is a list of its own: give either nodes or a selector, not both")
    if given and not (nodes or pool is not None or features or labels or everything):
        reader.fail(path, "names no node: give nodes, or a pool, features or labels (or all: true)")
    return Targets(
        nodes=nodes,
        pool=pool,
        features=frozenset(features),
        labels=labels,
        everything=everything,
    )


def _step(reader: _Reader, data: Any, folder: Path | None, key: str = "step") -> Step:
    path: YamlPath = (key,)
    if data is None:
        reader.fail(path, f"missing: the step each node runs ({' or '.join(_STEPS)})")
        return Step(StepKind.COMMAND)
    if not isinstance(data, dict):
        reader.fail(path, f"expected a mapping, found {describe(data)}")
        return Step(StepKind.COMMAND)
    kinds = [k for k in data if k in _STEPS]
    for key in data:
        if key not in _STEP:
            line = reader.positions.line((*path, str(key)))
            reader.errors.append(
                located(
                    reader.file,
                    line,
                    (*path, str(key)),
                    f"unknown step {str(key)!r}{suggest(key, list(_STEP))}"
                    f" (a step is one of: {', '.join(_STEPS)}; with extra_vars, inventory,"
                    " timeout)",
                )
            )
    timeout = reader.seconds(data.get("timeout"), (*path, "timeout"), 1800.0)
    if len(kinds) != 1:
        if not any(k not in _STEP for k in data):
            reader.fail(path, f"give exactly one of {', '.join(_STEPS)}, found {len(kinds)}")
        return Step(StepKind.COMMAND)
    kind = StepKind(kinds[0])
    if kind is StepKind.COMMAND:
        for key in ("inventory", "extra_vars"):
            if key in data:
                reader.fail((*path, key), "only an ansible step takes it")
        return Step(
            kind, command=reader.argv(data["command"], (*path, "command")), timeout_s=timeout
        )
    playbook = _file(reader, data["ansible"], (*path, "ansible"), folder, "playbook")
    inventory = None
    if "inventory" in data:
        inventory = _file(reader, data["inventory"], (*path, "inventory"), folder, "inventory")
    elif key == "step":
        reader.fail(path, "missing: inventory (the Ansible inventory that holds the targets)")
    extra = (
        reader.text_map(data["extra_vars"], (*path, "extra_vars")) if "extra_vars" in data else {}
    )
    return Step(kind, playbook=playbook, inventory=inventory, extra_vars=extra, timeout_s=timeout)


def _file(
    reader: _Reader, value: Any, path: YamlPath, folder: Path | None, what: str
) -> str | None:
    if not isinstance(value, str) or not value:
        reader.fail(path, f"expected the path of the {what}, found {describe(value)}")
        return None
    found = Path(value) if folder is None else folder / value
    if folder is not None and not found.resolve().is_relative_to(folder.resolve()):
        reader.fail(path, f"{what} {value} is outside the operation's folder {folder}")
        return None
    if folder is not None and not found.is_file():
        reader.fail(path, f"{what} {value} not found (looked for {found})")
        return None
    return str(found)


def _budget(reader: _Reader, value: Any) -> Budget:
    path: YamlPath = ("max_unavailable",)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return Budget(count=value)
    if isinstance(value, str):
        found = _PERCENT.match(value.strip())
        if found is not None and 0 < float(found.group(1)) <= 100:
            return Budget(percent=float(found.group(1)))
    reader.fail(
        path,
        f"expected a number of nodes (at least 1) or a percentage such as 10%, found"
        f" {describe(value)}",
    )
    return Budget(percent=25.0)


def parse_operation(text: str, file: str, folder: Path | None = None) -> Operation:
    """The operation in ``text`` (from ``file``); ``folder``: where its paths are relative to
    (None: not checked). ``RulesError`` lists every problem."""
    data, positions, problems = parse_yaml(text)
    reader = _Reader(file, positions)
    reader.errors.extend(from_yaml(file, p) for p in problems)
    if data is None and reader.errors:
        raise RulesError(reader.errors)
    root = reader.mapping(data if data is not None else {}, (), _TOP)
    name = root.get("operation")
    if not isinstance(name, str) or _NAME.match(name) is None:
        reader.fail(
            ("operation",),
            f"expected the operation's name (letters, digits, '.', '_', '-'; at most 63),"
            f" found {describe(name) if 'operation' in root else 'nothing'}",
        )
        name = "operation"
    targets = _targets(reader, root.get("targets"))
    step = _step(reader, root.get("step"), folder)
    reboot = None
    if root.get("reboot", False) is not False:
        reboot = _step(reader, root["reboot"], folder, "reboot")
        if reboot.kind is StepKind.ANSIBLE and reboot.inventory is None:
            reboot = replace(reboot, inventory=step.inventory)
    quarantine = root.get("quarantine", "scheduler")
    if not isinstance(quarantine, str) or not quarantine:
        reader.fail(
            ("quarantine",),
            f"expected an executor name (scheduler, slurm, kubernetes) or none, found"
            f" {describe(quarantine)}",
        )
        quarantine = "scheduler"
    validation = None
    if "validate" in root:
        given = reader.mapping(root["validate"], ("validate",), _VALIDATE)
        if "command" not in given:
            reader.fail(("validate",), "missing: command (the health gate, argv)")
        else:
            validation = Validation(
                command=reader.argv(given["command"], ("validate", "command")),
                timeout_s=reader.seconds(given.get("timeout"), ("validate", "timeout"), 600.0),
            )
    timing = Timing()
    if "timing" in root:
        given = reader.mapping(root["timing"], ("timing",), _TIMING)
        timing = Timing(
            *(
                reader.seconds(given.get(key), ("timing", key), default)
                for key, default in zip(
                    ("quarantine", "step", "reboot", "validate", "return"),
                    (60.0, 600.0, 300.0, 120.0, 10.0),
                    strict=True,
                )
            )
        )
    skip_label = root.get("skip_label", SKIP_LABEL)
    if not isinstance(skip_label, str) or not skip_label:
        reader.fail(("skip_label",), f"expected a label name, found {describe(skip_label)}")
        skip_label = SKIP_LABEL
    on_stop = root.get("on_stop", OnStop.FINISH.value)
    if on_stop not in tuple(OnStop):
        reader.fail(
            ("on_stop",),
            f"expected what a running step does when the operation stops: finish or cancel,"
            f" found {describe(on_stop)}",
        )
        on_stop = OnStop.FINISH.value
    operation = Operation(
        name=name,
        targets=targets,
        step=step,
        validate=validation,
        reboot=reboot,
        quarantine=quarantine,
        canary=reader.whole(root, "canary", 1, 0),
        max_parallel=reader.whole(root, "max_parallel", 1, 1),
        max_unavailable=_budget(reader, root.get("max_unavailable", "25%")),
        failure_threshold=reader.whole(root, "failure_threshold", 1, 1),
        enforce=reader.flag(root, ("enforce",), False),
        approval=reader.flag(root, ("approval",), False),
        skip_label=skip_label,
        timing=timing,
        on_stop=OnStop(on_stop),
        file=file,
    )
    if reader.errors:
        raise RulesError(reader.errors)
    return operation


def load_operation(path: Path) -> Operation:
    """The operation file at ``path`` (its paths relative to its folder)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesError([RuleError(str(path), 1, f"cannot read the file: {exc}")]) from None
    return parse_operation(text, str(path), path.parent)
