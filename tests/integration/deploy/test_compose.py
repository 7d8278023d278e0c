"""The compose stack's one-shot scripts run with ``sh`` do what the services expect of them
(tokens the engine accepts, the database password made once, a setup script that parses),
and ``amtool check-config`` accepts the Alertmanager configuration."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuops.api.tokens import hash_token, parse_users

REPO = Path(__file__).resolve().parents[3]


def test_tokens_script_makes_the_database_password_once(tmp_path: Path) -> None:
    script = REPO / "deploy" / "engine" / "init-tokens.sh"
    (tmp_path / "db").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "GPUOPS_SECRETS_DIR": str(tmp_path),
        "GPUOPS_DB_SECRET_DIR": str(tmp_path / "db"),
    }
    subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True)
    password = (tmp_path / "db" / "db-password").read_text()
    assert len(password.strip()) >= 32
    subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True)
    assert (tmp_path / "db" / "db-password").read_text() == password


def test_tokens_script_makes_tokens_the_engine_accepts(tmp_path: Path) -> None:
    script = REPO / "deploy" / "engine" / "init-tokens.sh"
    env = {"PATH": "/usr/bin:/bin", "GPUOPS_SECRETS_DIR": str(tmp_path)}
    subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True)
    users = parse_users((tmp_path / "tokens.yaml").read_text(), "tokens.yaml")
    by_name = {u.name: u for u in users}
    for name, role in (("alertmanager", "alertmanager"), ("admin", "admin")):
        token = (tmp_path / f"{name}-token").read_text().strip()
        assert len(token) >= 32
        assert by_name[name].roles == (role,)
        assert by_name[name].token_sha256 == hash_token(token)
    assert (tmp_path / "admin-token").stat().st_mode & 0o077 == 0
    before = (tmp_path / "tokens.yaml").read_text()
    subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True)
    assert (tmp_path / "tokens.yaml").read_text() == before, "a second start replaced the tokens"


def test_the_setup_script_parses() -> None:
    subprocess.run(["sh", "-n", str(REPO / "deploy" / "setup" / "setup.sh")], check=True)


@pytest.mark.integration
def test_alertmanager_config_passes_amtool() -> None:
    amtool = shutil.which("amtool") or "/usr/bin/amtool"
    if not Path(amtool).exists():
        pytest.skip("amtool is not installed (Debian package prometheus-alertmanager)")
    result = subprocess.run(
        [amtool, "check-config", str(REPO / "deploy" / "alertmanager" / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
