"""Line tracking of the YAML reader: keys, list items, duplicates, anchors."""

from __future__ import annotations

from gpuops.model.rules.yamlsource import parse_yaml

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
