"""What a user reads is the product as it is: no project history in the docs, the README, the
shipped rules, configuration and deploy files; no reference to a file outside the repository;
every relative link of the docs leads to a file; the README's first commands are the two a
newcomer needs; the examples a guide shows are the files it runs; the exporter the install guide
starts is one its Prometheus configuration scrapes."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PRODUCT = (
    "README.md",
    "docs",
    "rules",
    "examples/helios-earth",
    "config",
    "deploy",
    "elk",
    "grafana",
    "docker-compose.yml",
    "Dockerfile",
)
"""What users read; CHANGELOG.md is where history goes."""
TEXT = {".md", ".yaml", ".yml", ".json", ".ndjson", ".sh", ".service", ".example", ".toml", ""}
HISTORY = re.compile(r"issue [0-9]+|\bround\b|review finding", re.I)


def product_files() -> list[Path]:
    files: list[Path] = []
    for name in PRODUCT:
        path = REPO / name
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [p for p in files if p.suffix in TEXT]


def markdown() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_history_in_what_users_read(path: Path) -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "history belongs in CHANGELOG.md or git:\n" + "\n".join(found)


@pytest.mark.parametrize("path", [*markdown(), *product_files()], ids=lambda p: p.name)
def test_nothing_cites_a_file_outside_the_repository(path: Path) -> None:
    text = path.read_text(errors="replace")
    assert not re.search(r"\.\./shared|DESIGN(\.md)?\b|STYLE\.md", text), path


@pytest.mark.parametrize("path", markdown(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_files(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: broken links {broken}"


def test_the_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    commands = [line.split("#")[0].strip() for line in lines[:40] if line.startswith("make ")]
    assert commands[:2] == ["make demo", "make test"], commands
    assert len(lines) <= 150, len(lines)


def test_every_page_of_docs_is_in_the_index() -> None:
    index = (REPO / "docs" / "index.md").read_text()
    pages = [p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")]
    missing = [p for p in pages if p != "index.md" and f"({p})" not in index]
    assert not missing, f"docs/index.md does not list {missing}"


@pytest.mark.parametrize("name", ["long-queue.yaml", "long-queue.test.yaml"])
def test_the_first_policy_guide_shows_the_files_it_runs(name: str) -> None:
    guide = (REPO / "docs" / "first-policy.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.S)
    assert (REPO / "docs" / "examples" / name).read_text() in blocks


def test_the_nvml_exporter_the_install_guide_starts_is_in_the_scrape_config_it_writes() -> None:
    text = (REPO / "docs" / "install.md").read_text()
    started = re.search(r"gpuops exporter nvml --host (\S+) --port (\d+) --fake-nvml", text)
    assert started, "the install guide starts a simulated NVML exporter"
    written = re.search(r"printf -- '(.+)' > /etc/prometheus/gpuops/(gpu-nodes/\S+\.yml)", text)
    assert written, "the install guide writes a gpu-nodes file of the Prometheus configuration"
    groups = yaml.safe_load(written.group(1).replace("\\n", "\n"))
    assert f"{started.group(1)}:{started.group(2)}" in groups[0]["targets"]
    cluster = yaml.safe_load((REPO / "deploy" / "prometheus" / "cluster.yml").read_text())
    (job,) = [j for j in cluster["scrape_configs"] if j["job_name"] == "gpu-nodes"]
    patterns = [f for sd in job["file_sd_configs"] for f in sd["files"]]
    assert any(fnmatch(written.group(2), pattern) for pattern in patterns), patterns


@pytest.mark.parametrize("path", markdown(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_table_row_has_the_cells_of_its_header(path: Path) -> None:
    """GitHub splits a table row at every unescaped `|`, in code spans too: a row with more
    cells than its header loses the rest, and a row broken over two lines ends the table."""
    lines = path.read_text().splitlines()
    cells = [len(re.findall(r"(?<!\\)\|", line)) for line in lines]
    for at, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.match(r"\|\s*:?-", lines[at + 1])):
            continue
        row = at + 2
        while row < len(lines) and lines[row].startswith("|"):
            assert cells[row] == cells[at], f"{path.name}:{row + 1}: {lines[row][:80]}"
            row += 1
        follows = lines[row] if row < len(lines) else ""
        assert not follows.strip(), f"{path.name}:{row + 1}: a table row not starting with |"
