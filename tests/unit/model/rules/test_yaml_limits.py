"""Bounded parsing: alias bombs, deep nesting and huge files are refused with ``file:line``
before anything is built, by the loader, ``/rules/validate`` and the reload watcher alike (an
unbounded parser spends minutes and gigabytes on a 353-byte bomb)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from gpuops.model.rules.loader import load_rules, load_rules_text
from gpuops.model.rules.model import RulesError
from gpuops.model.rules.yamlsource import YamlLimits, parse_yaml

LEVELS = "abcdefghi"
BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{x}: &{x} [{', '.join([f'*{p}'] * 9)}]\n"
        for p, x in zip(LEVELS, LEVELS[1:], strict=False)
    )
    + "groups: *i\n"
)
"""9 levels of 9 aliases: 9**9 (387 million) strings once expanded, from 417 bytes."""
REFUSED = "YAML refused: aliases expand the document to more than 1000000 nodes (an alias bomb?)"


def test_an_alias_bomb_is_refused_at_its_line_without_expanding(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    tracemalloc.start()
    with pytest.raises(RulesError) as exc:
        load_rules([path])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert str(exc.value) == f"{path}:7: {REFUSED}; the file is not used"
    assert peak < 20 * 1024 * 1024  # nothing was expanded


def test_nesting_aliases_size_and_each_limit_at_its_edge() -> None:
    limits = YamlLimits(max_depth=3, max_aliases=2, max_nodes=7, max_bytes=64)
    assert parse_yaml("a: [[1]]", limits)[2] == []  # depth 3: mapping, list, list
    (deep,) = parse_yaml("a:\n  - [[1]]", limits)[2]
    assert (deep.line, deep.message) == (
        2,
        "YAML refused: nested deeper than 3 mappings and lists; the file is not used",
    )
    assert parse_yaml("a: &x 1\nb: [*x, *x]", limits)[2] == []
    (aliases,) = parse_yaml("a: &x 1\nb: [*x, *x,\n  *x]", limits)[2]
    assert (aliases.line, aliases.message) == (
        3,
        "YAML refused: more than 2 aliases; the file is not used",
    )
    assert parse_yaml("a: &x [1]\nb: *x", limits)[2] == []  # 7 nodes expanded
    (nodes,) = parse_yaml("a: &x [1, 2]\nb: *x", limits)[2]
    assert nodes.line == 2 and "more than 7 nodes" in nodes.message
    (nested,) = parse_yaml("a: &x [[1]]\nb: [*x]", YamlLimits(max_depth=3))[2]
    assert (
        nested.line == 2
        and nested.message == "YAML refused: aliases nest it deeper than 3; the file is not used"
    )
    assert parse_yaml("a: " + "x" * 61, limits)[2] == []
    (size,) = parse_yaml("a: " + "x" * 62, limits)[2]
    assert size.message == "file of 65 bytes is larger than the limit of 64 bytes"


def test_a_deeply_nested_file_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(RulesError) as exc:
        load_rules_text("groups: " + "[" * 100_000, "deep.yaml")
    assert str(exc.value) == (
        "deep.yaml:1: YAML refused: nested deeper than 64 mappings and lists; the file is not used"
    )


def test_a_rule_file_over_the_size_limit_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(YamlLimits().max_bytes + 1)  # sparse: nothing to read if it were read
    with pytest.raises(RulesError) as exc:
        load_rules([path])
    assert (
        str(exc.value)
        == f"{path}:1: file of 4194305 bytes is larger than the limit of 4194304 bytes"
    )
