"""YAML text to plain data, remembering the line of every key and item.

Used by ``gpuops.model.rules.loader`` (rule files) and ``gpuops.model.rules.testspec`` (policy test
files)
so that each error can name its file and line. PyYAML's SafeLoader parses; the subclass here
only records marks and duplicate keys. Tabs and syntax errors become ``YamlProblem``s, never
tracebacks.

Parsing is bounded (``YamlLimits``): size, nesting depth, aliases, and the number of nodes the
document would have with every alias expanded, counted on the composed node graph before
anything is constructed. An alias bomb (a few hundred bytes that expand to billions of nodes)
is refused in milliseconds at the line of the alias that crosses the limit.
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
class YamlLimits:
    """Bounds on one YAML document. The defaults are far above any real rule, test or config
    file (the shipped rules are ~10 KB, depth 8, no aliases) and far below what hurts."""

    max_bytes: int = 4 * 1024 * 1024
    """UTF-8 size of the text: a rule file of 4 MiB holds ~10,000 policies."""
    max_depth: int = 64
    """Nested mappings and lists (PyYAML composes recursively: deep nesting would exhaust the
    stack)."""
    max_aliases: int = 1_000
    """``*alias`` uses."""
    max_nodes: int = 1_000_000
    """Nodes of the document with every alias expanded (what validation will walk)."""


class YamlLimitError(yaml.YAMLError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


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

    def __init__(self, stream: str, limits: YamlLimits) -> None:
        super().__init__(stream)
        self.line_marks: dict[int, _MappingMarks | _SequenceMarks] = {}
        self.limits = limits
        self._depth = 0
        self._aliases = 0
        self.alias_lines: dict[tuple[int, int], int] = {}
        """Line of each alias use by (id of its mapping or list, index or id of its key)."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self.limits.max_aliases:
                raise YamlLimitError(line, f"more than {self.limits.max_aliases} aliases")
            if parent is not None:
                where = index if isinstance(index, int) else id(index)
                self.alias_lines[(id(parent), where)] = line
        nests = self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent)  # type: ignore[no-untyped-call]
        self._depth += 1 if nests else 0
        try:
            if nests and self._depth > self.limits.max_depth:
                raise YamlLimitError(
                    line, f"nested deeper than {self.limits.max_depth} mappings and lists"
                )
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1 if nests else 0

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


def _walk(
    data: Any,
    path: YamlPath,
    loader: _LineLoader,
    positions: Positions,
    problems: list[YamlProblem],
    ancestors: frozenset[int] = frozenset(),
) -> None:
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
            _walk(value, child, loader, positions, problems, ancestors)
    elif isinstance(data, list) and isinstance(marks, _SequenceMarks):
        for index, (value, line) in enumerate(zip(data, marks.items, strict=True)):
            positions.add((*path, index), line)
            _walk(value, (*path, index), loader, positions, problems, ancestors)


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


def check_expansion(
    root: yaml.Node, limits: YamlLimits, alias_lines: dict[tuple[int, int], int]
) -> YamlLimitError | None:
    """What is wrong with ``root`` once every alias is expanded: more than ``max_nodes`` nodes
    or deeper than ``max_depth`` (an alias nests its anchor's value where it is used). Linear
    in the composed graph: an alias is the same node object again, measured once."""
    measured: dict[int, tuple[int, int]] = {}  # node -> (expanded nodes, expanded height)
    on_path: set[int] = set()
    total = 0

    def visit(node: yaml.Node, above: int, line: int) -> tuple[int, int]:
        """``above``: mappings and lists around ``node``, used at ``line``; returns (nodes,
        height) of it."""
        nonlocal total
        known = measured.get(id(node))
        if known is not None:
            total += known[0]
        if total > limits.max_nodes:
            raise YamlLimitError(
                line,
                f"aliases expand the document to more than {limits.max_nodes} nodes "
                "(an alias bomb?)",
            )
        if known is not None:
            if above + known[1] > limits.max_depth:
                raise YamlLimitError(line, f"aliases nest it deeper than {limits.max_depth}")
            return known
        total += 1
        if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            return 1, 0
        if id(node) in on_path:
            return 1, 1  # a recursive alias: reported by the walk that constructs it
        if above + 1 > limits.max_depth:
            raise YamlLimitError(line, f"aliases nest it deeper than {limits.max_depth}")
        children: list[tuple[yaml.Node, int]] = (
            [(n, id(key)) for key, value in node.value for n in (key, value)]
            if isinstance(node, yaml.MappingNode)
            else [(n, i) for i, n in enumerate(node.value)]
        )
        on_path.add(id(node))
        size, height = 1, 1
        for child, where in children:
            used_at = alias_lines.get((id(node), where), child.start_mark.line + 1)
            child_size, child_height = visit(child, above + 1, used_at)
            size, height = size + child_size, max(height, child_height + 1)
        on_path.discard(id(node))
        measured[id(node)] = (size, height)
        return size, height

    try:
        visit(root, 0, root.start_mark.line + 1)
    except YamlLimitError as exc:
        return exc
    return None


def parse_yaml(
    text: str,
    limits: YamlLimits = YamlLimits(),  # noqa: B008 (frozen)
) -> tuple[Any, Positions, list[YamlProblem]]:
    """Parse one YAML document within ``limits``. Returns the data (None when empty or
    unreadable), the positions of its keys and items, and the problems found (duplicate keys,
    tabs, syntax, limits)."""
    positions = Positions()
    size = len(text.encode("utf-8", errors="replace"))
    if size > limits.max_bytes:
        message = f"file of {size} bytes is larger than the limit of {limits.max_bytes} bytes"
        return None, positions, [YamlProblem(1, (), message)]
    tabs = _tab_problems(text)
    if tabs:
        return None, positions, tabs
    try:
        loader = _LineLoader(text, limits)  # PyYAML's reader checks for unprintable characters here
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
        node = loader.get_single_node()
        expansion = check_expansion(node, limits, loader.alias_lines) if node is not None else None
        if expansion is not None:
            raise expansion
        data = loader.construct_document(node) if node is not None else None
    except YamlLimitError as exc:
        problem = f"YAML refused: {exc.message}; the file is not used"
        return None, positions, [YamlProblem(exc.line, (), problem)]
    except yaml.YAMLError as exc:
        return None, positions, [_syntax_problem(exc)]
    finally:
        loader.dispose()
    root = loader.line_marks.get(id(data))
    positions.add((), root.start if root is not None else 1)
    problems: list[YamlProblem] = []
    _walk(data, (), loader, positions, problems)
    if any(p.message == RECURSIVE_ALIAS for p in problems):
        return None, positions, problems  # unusable: validating it would never end
    return data, positions, problems
