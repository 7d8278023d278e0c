"""Each invalid fixture yields exactly the messages in its ``.expected`` file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.model.rules.loader import load_rules, load_rules_text
from gpuops.model.rules.model import RulesError

INVALID = Path(__file__).resolve().parents[3] / "fixtures" / "rules" / "invalid"
CASES = sorted(INVALID.glob("*.yaml"))


def messages(path: Path) -> list[str]:
    with pytest.raises(RulesError) as caught:
        load_rules_text(path.read_text(encoding="utf-8"), path.name)
    return [str(e) for e in caught.value.errors]


def test_there_are_at_least_25_distinct_mistakes() -> None:
    assert len(CASES) >= 25
    assert all(p.with_suffix(".expected").is_file() for p in CASES)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_invalid_fixture_gives_its_exact_messages(path: Path) -> None:
    expected = path.with_suffix(".expected").read_text(encoding="utf-8").splitlines()
    assert messages(path) == expected


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_every_message_names_file_and_line(path: Path) -> None:
    with pytest.raises(RulesError) as caught:
        load_rules([path])
    for error in caught.value.errors:
        assert error.file == str(path)
        assert error.line >= 1
        assert str(error).startswith(f"{path}:{error.line}: ")
        assert "Traceback" not in error.message


def test_all_errors_of_a_file_are_reported_in_line_order() -> None:
    lines = [int(m.split(":")[1]) for m in messages(INVALID / "many-mistakes.yaml")]
    assert len(lines) == 6
    assert lines == sorted(lines)
