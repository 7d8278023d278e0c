"""``gpuops exporter nvml``'s node agent reboot flags through click: what they need is said
before anything starts."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["exporter", "nvml", "--fake-nvml", "gpu-lost", *args])
    return result.exit_code, result.stderr


def test_the_reboot_needs_the_agent() -> None:
    code, err = run("--agent-reboot")
    assert code == 2
    assert "Error: --agent-reboot needs --agent (the node agent)" in err


def test_an_empty_reboot_command_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n", encoding="utf-8")
    agent = ("--agent", "--agent-token-file", str(token), "--agent-reboot")
    code, err = run(*agent, "--agent-reboot-command", " ")
    assert code == 2
    assert "Error: --agent-reboot-command is empty" in err
