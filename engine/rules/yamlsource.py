"""YAML text to plain data, remembering the line of every key and item.

Used by ``engine.rules.loader`` (rule files) and ``engine.rules.testspec`` (policy test files)
so that each error can name its file and line. PyYAML's SafeLoader parses; the subclass here
only records marks and duplicate keys. Tabs and syntax errors become ``YamlProblem``s, never
tracebacks.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

YamlPath = tuple[str | int, ...]
_TAB_INDENT = re.compile(r"^ *\t")


@dataclass(frozen=True)
class YamlProblem:
    """A problem found while reading YAML: the line (1-based), where in the data, what."""

    line: int
    path: YamlPath
    message: str


@dataclass
class _MappingMarks:
    start: int
    keys: dict[Hashable, int] = field(default_factory=dict)
    values: dict[Hashable, int] = field(default_factory=dict)
    duplicates: list[tuple[Hashable, int, int]] = field(default_factory=list)


@dataclass
class _SequenceMarks:
    start: int
    items: list[int] = field(default_factory=list)


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader that records, per constructed mapping and list, the line of each entry."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.line_marks: dict[int, _MappingMarks | _SequenceMarks] = {}

    def construct_marked_mapping(self, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
        data: dict[Any, Any] = {}
        yield data
        self.flatten_mapping(node)
        marks = _MappingMarks(node.start_mark.line + 1)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=False)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found an unhashable key (a list or mapping used as a key)",
                    key_node.start_mark,
                )
            line = key_node.start_mark.line + 1
            if key in marks.keys:
                marks.duplicates.append((key, marks.keys[key], line))
            marks.keys[key] = line
            marks.values[key] = value_node.start_mark.line + 1
            data[key] = self.construct_object(value_node, deep=False)
        self.line_marks[id(data)] = marks

    def construct_marked_sequence(self, node: yaml.SequenceNode) -> Iterator[list[Any]]:
        data: list[Any] = []
        yield data
        marks = _SequenceMarks(node.start_mark.line + 1)
        for item in node.value:
            marks.items.append(item.start_mark.line + 1)
            data.append(self.construct_object(item, deep=False))
        self.line_marks[id(data)] = marks


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_marked_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_marked_sequence)


class Positions:
    """Line numbers of a parsed document by path (``("groups", 0, "rules", 1, "for")``)."""

    def __init__(self) -> None:
        self._value_lines: dict[YamlPath, int] = {}
        self._key_lines: dict[YamlPath, int] = {}

    def add(self, path: YamlPath, value_line: int, key_line: int | None = None) -> None:
        self._value_lines[path] = value_line
        self._key_lines[path] = key_line if key_line is not None else value_line

    def line(self, path: YamlPath) -> int:
        """The line of the key at ``path`` (or of its nearest known ancestor)."""
        for end in range(len(path), -1, -1):
            line = self._key_lines.get(path[:end])
            if line is not None:
                return line
        return 1

    def value_line(self, path: YamlPath) -> int:
        """The line where the value at ``path`` starts (or that of its nearest ancestor)."""
        for end in range(len(path), -1, -1):
            line = self._value_lines.get(path[:end])
            if line is not None:
                return line
        return 1

    def key_lines(self, path: YamlPath) -> dict[str, int]:
        """Lines of the string keys of the mapping at ``path``."""
        depth = len(path) + 1
        return {
            str(p[-1]): line
            for p, line in self._key_lines.items()
            if len(p) == depth and p[: len(path)] == path and isinstance(p[-1], str)
        }


RECURSIVE_ALIAS = "recursive alias: an anchor is used inside its own value"
TOO_MANY_VALUES = "aliases expand to more than {limit} values (an alias bomb?): expand them less"


class _TooLarge(Exception):
    """The data, its aliases expanded, has more values than ``parse_yaml`` walks."""


def _walk(
    data: Any,
    path: YamlPath,
    loader: _LineLoader,
    positions: Positions,
    problems: list[YamlProblem],
    ancestors: frozenset[int] = frozenset(),
    budget: list[int] | None = None,
) -> None:
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge
    if isinstance(data, dict | list):
        if id(data) in ancestors:
            problems.append(YamlProblem(positions.line(path), path, RECURSIVE_ALIAS))
            return
        ancestors = ancestors | {id(data)}
    marks = loader.line_marks.get(id(data))
    if isinstance(data, dict) and isinstance(marks, _MappingMarks):
        for key, first, second in marks.duplicates:
            problems.append(
                YamlProblem(
                    second,
                    (*path, str(key)),
                    f'duplicate key "{key}" (check lines {first} and {second})',
                )
            )
        for key, value in data.items():
            child = (*path, key if isinstance(key, str | int) else str(key))
            positions.add(child, marks.values[key], marks.keys[key])
            _walk(value, child, loader, positions, problems, ancestors, budget)
    elif isinstance(data, list) and isinstance(marks, _SequenceMarks):
        for index, (value, line) in enumerate(zip(data, marks.items, strict=True)):
            positions.add((*path, index), line)
            _walk(value, (*path, index), loader, positions, problems, ancestors, budget)


def _tab_problems(text: str) -> list[YamlProblem]:
    return [
        YamlProblem(
            number,
            (),
            "tab character in indentation (YAML indents with spaces only; replace the tab)",
        )
        for number, line in enumerate(text.splitlines(), start=1)
        if _TAB_INDENT.match(line)
    ]


def _syntax_problem(exc: yaml.YAMLError) -> YamlProblem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        parts = [p for p in (exc.context, exc.problem) if p]
        if exc.context_mark is not None and exc.problem_mark is not None and exc.context:
            parts[0] = f"{exc.context} (line {exc.context_mark.line + 1})"
        hint = " (check the indentation of this line)" if "<block end>" in str(exc.problem) else ""
        return YamlProblem(line, (), "YAML syntax error: " + ", ".join(parts) + hint)
    return YamlProblem(1, (), f"YAML syntax error: {exc}")


def parse_yaml(text: str) -> tuple[Any, Positions, list[YamlProblem]]:
    """Parse one YAML document. Returns the data (None when empty or unreadable), the
    positions of its keys and items, and the problems found (duplicate keys, tabs, syntax)."""
    positions = Positions()
    tabs = _tab_problems(text)
    if tabs:
        return None, positions, tabs
    try:
        loader = _LineLoader(text)  # PyYAML's reader checks for unprintable characters here
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        return (
            None,
            positions,
            [
                YamlProblem(
                    line,
                    (),
                    f"unprintable character U+{int(exc.character):04X} (YAML allows printable "
                    "characters only; remove it)",
                )
            ],
        )
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        return None, positions, [_syntax_problem(exc)]
    finally:
        loader.dispose()
    root = loader.line_marks.get(id(data))
    positions.add((), root.start if root is not None else 1)
    problems: list[YamlProblem] = []
    # without aliases a document has fewer values than characters; aliases may repeat a value
    # (each one can multiply the data: a few lines of nested aliases make billions of values)
    limit = max(10_000, 4 * len(text))
    try:
        _walk(data, (), loader, positions, problems, budget=[limit])
    except _TooLarge:
        return None, Positions(), [YamlProblem(1, (), TOO_MANY_VALUES.format(limit=limit))]
    if any(p.message == RECURSIVE_ALIAS for p in problems):
        return None, positions, problems  # unusable: validating it would never end
    return data, positions, problems
