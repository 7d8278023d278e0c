"""The modules, classes and functions the docs name exist: every `gpuops.x.y` in backticks is
a module of the package or something one of them defines, and every `gpuops/...` and
`tests/...` path is a file or folder of the tree. The tree changes; so must the pages that
describe it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {p.stem for p in (REPO / "gpuops").iterdir() if not p.name.startswith("_")}
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_names_a_page_gives_exist(page: Path) -> None:
    text = page.read_text()
    names = {
        name
        for name in re.findall(r"`(gpuops(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text)
        if name.split(".")[1] in PACKAGES  # not an audit field such as gpuops.decision.id
    }
    missing = sorted(n for n in names if not resolves(n))
    paths = set(re.findall(r"`((?:gpuops|tests)/[\w/.-]*)`", text))
    missing += sorted(p for p in paths if not (REPO / p.rstrip("/")).exists())
    assert not missing, f"{page.relative_to(REPO)} names what the tree does not have: {missing}"
