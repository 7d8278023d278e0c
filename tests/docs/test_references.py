"""The generated references in docs/ are what ``gpuops reference config|cli`` prints now, and
every key and command they list has a text: a setting without a docstring, a command or option
without help, or a file not regenerated after a change fails here.

Regenerate with ``gpuops reference config > docs/configuration.md`` and
``gpuops reference cli > docs/reference/cli.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from gpuops.audit.settings import AuditSettings
from gpuops.cli import cli
from gpuops.cli.reference import (
    cli_reference,
    config_reference,
    dataclass_docstrings,
    walk_commands,
)
from gpuops.settings import EngineConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def models(model: type[BaseModel], path: str = "") -> list[tuple[str, type[BaseModel]]]:
    found = [(path or "(top level)", model)]
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += models(annotation, f"{path}.{name}".lstrip("."))
    return found


def test_configuration_md_is_what_the_settings_say() -> None:
    assert (DOCS / "configuration.md").read_text() == config_reference(), (
        "docs/configuration.md is out of date: gpuops reference config > docs/configuration.md"
    )


def test_every_key_of_the_engine_configuration_has_a_docstring() -> None:
    undocumented = [
        f"{path}.{name}".lstrip(".") if path != "(top level)" else name
        for path, model in models(EngineConfig)
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undocumented, f"settings without a docstring: {undocumented}"
    sections = [path for path, model in models(EngineConfig) if not (model.__doc__ or "").strip()]
    assert not sections, f"sections without a docstring: {sections}"


def test_every_audit_setting_has_a_docstring() -> None:
    docs = dataclass_docstrings(AuditSettings)
    missing = [f.name for f in dataclasses.fields(AuditSettings) if f.name not in docs]
    assert not missing, f"AuditSettings fields without a docstring: {missing}"


def test_cli_md_is_what_the_commands_say() -> None:
    assert (DOCS / "reference" / "cli.md").read_text() == cli_reference(cli), (
        "docs/reference/cli.md is out of date: gpuops reference cli > docs/reference/cli.md"
    )


def test_every_command_and_option_has_help() -> None:
    problems = []
    for path, command in walk_commands(cli):
        name = " ".join(path)
        if not (command.help or "").strip():
            problems.append(f"{name}: no help")
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                problems.append(f"{name} {param.opts[0]}: no help")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("what", ["config", "cli"])
def test_the_reference_commands_print_the_files(what: str) -> None:
    result = CliRunner().invoke(cli, ["reference", what])
    assert result.exit_code == 0, result.output
    path = DOCS / ("configuration.md" if what == "config" else "reference/cli.md")
    assert result.output == path.read_text()


def test_an_option_without_a_default_shows_none() -> None:
    text = cli_reference(cli)
    assert "Sentinel" not in text and "UNSET" not in text
    assert "| `--url` | text |  | Elasticsearch URL" in text
