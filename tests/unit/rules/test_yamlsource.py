"""Line tracking of the YAML reader: keys, list items, duplicates, anchors."""

from __future__ import annotations

from engine.rules.yamlsource import parse_yaml

TEXT = """\
top:
  a: 1
  list:
    - x
    -
      b: 2
      b: 3
shared: &anchor {k: v}
copy: *anchor
"""


def test_lines_of_keys_and_items() -> None:
    data, positions, problems = parse_yaml(TEXT)
    assert data["top"]["list"][1] == {"b": 3}
    assert positions.line(("top", "a")) == 2
    assert positions.line(("top", "list", 0)) == 4
    assert positions.line(("top", "list", 1)) == 6
    assert positions.value_line(("top", "list")) == 4
    assert positions.line(("top", "list", 1, "b")) == 7
    assert positions.line(("top", "list", 1, "nope", "deeper")) == 6  # nearest ancestor
    assert positions.line(("copy", "k")) == 8
    assert [(p.line, p.path, p.message) for p in problems] == [
        (7, ("top", "list", 1, "b"), 'duplicate key "b" (check lines 6 and 7)')
    ]


def test_key_lines_of_a_mapping() -> None:
    _, positions, _ = parse_yaml(TEXT)
    assert positions.key_lines(("top",)) == {"a": 2, "list": 3}


def test_syntax_errors_and_tabs_are_problems_not_exceptions() -> None:
    assert [p.line for p in parse_yaml("a: [1, 2\nb: 3\n")[2]] == [2]
    tabs = parse_yaml("a:\n\tb: 1\n  c: 2\n\t\td: 3\n")[2]
    assert [p.line for p in tabs] == [2, 4]
    assert parse_yaml("")[0] is None


def alias_bomb(levels: int) -> str:
    """Each level's list holds the previous one nine times: 9**levels values in a few lines."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"groups: *l{levels - 1}", ""])


def test_an_alias_bomb_is_a_problem_not_a_hang() -> None:
    # 9**5 values from 6 lines took over a second, 9**10 never ended (rules validate, via the
    # API and the console: a developer could hang the engine's API threads)
    data, _, problems = parse_yaml(alias_bomb(5))
    assert data is None
    assert [(p.line, p.message) for p in problems] == [
        (1, "aliases expand to more than 10000 values (an alias bomb?): expand them less")
    ]
    assert parse_yaml(alias_bomb(12))[0] is None


def test_aliases_repeating_a_value_a_few_times_are_fine() -> None:
    data, _, problems = parse_yaml(alias_bomb(3))  # 729 values
    assert problems == [] and len(data["groups"]) == 9
