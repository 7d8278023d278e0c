"""The CLI with a PostgreSQL configuration (docs/ha.md): an unreachable database stops
``gpuops engine run`` and ``gpuops state check`` with the server named and the password
nowhere; ``gpuops state reset`` says it is for the SQLite file."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sources.promproc import free_port

SECRET = "s3cret-never-shown"


def _config(tmp_path: Path) -> Path:
    (tmp_path / "password").write_text(SECRET + "\n")
    (tmp_path / "rules").mkdir()
    port = free_port()  # nothing listens there
    config = tmp_path / "engine.yaml"
    config.write_text(
        "rules: [rules]\n"
        "metrics_listen: null\n"
        "audit: {spool_dir: audit}\n"
        f"state: {{url: 'postgresql://gpuops@127.0.0.1:{port}/gpuops',"
        " password_file: password}\n"
    )
    return config


def test_engine_run_names_the_unreachable_server_and_never_the_password(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = CliRunner().invoke(cli, ["engine", "run", "--config", str(config)])
    assert result.exit_code == 1
    assert "postgresql://gpuops@127.0.0.1:" in result.output
    assert "cannot connect" in result.output and "nothing was changed" in result.output
    assert SECRET not in result.output
    assert "gpuops state reset" not in result.output, "there is no file to reset"


def test_state_check_names_the_unreachable_server_and_reset_refuses_a_database(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    checked = CliRunner().invoke(cli, ["state", "check", "--config", str(config)])
    assert checked.exit_code == 1
    assert "postgresql://gpuops@127.0.0.1:" in checked.output
    assert "cannot connect" in checked.output and SECRET not in checked.output
    result = CliRunner().invoke(cli, ["state", "reset", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: {config}: the state is in PostgreSQL (state.url); gpuops state reset works on"
        " the SQLite state file only: the replicas share the database (docs/ha.md)"
    )
