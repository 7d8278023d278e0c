"""``gpuops token new``, the README's first step to ``gpuops decisions list``: it writes a
tokens file the engine accepts and prints only the token; a name twice or a broken file is
refused. What ``gpuops engine run`` does with a bad API configuration:
tests/integration/api/test_first_api_steps.py."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner, Result

from gpuops.api.tokens import TokenStore, hash_token, parse_users
from gpuops.cli import cli


def token_new(*args: str) -> Result:
    return CliRunner().invoke(cli, ["token", "new", *args])


def test_token_new_prints_a_tokens_file_the_engine_accepts() -> None:
    result = token_new("--name", "zoe", "--role", "auditor")
    assert result.exit_code == 0, result.output
    token = result.stderr.strip().rsplit(" ", 1)[1]
    [user] = parse_users(result.stdout, "stdout")
    assert (user.name, user.roles, user.token_sha256) == ("zoe", ("auditor",), hash_token(token))
    assert token not in result.stdout


def test_token_new_adds_users_to_a_tokens_file_and_prints_only_the_token(tmp_path: Path) -> None:
    path = tmp_path / "var" / "api-tokens.yaml"
    first = token_new("--name", "me", "--role", "admin", "--tokens-file", str(path))
    second = token_new("--name", "am", "--role", "alertmanager", "--tokens-file", str(path))
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    tokens = [first.stdout.strip(), second.stdout.strip()]
    assert all(len(t) >= 40 and "\n" not in t for t in tokens)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store = TokenStore(path, environ={})
    assert store.reload() == 2
    me, am = (store.authenticate(t) for t in tokens)
    assert me is not None and (me.name, me.roles) == ("me", ("admin",))
    assert am is not None and am.roles == ("alertmanager",)
    assert not any(t in path.read_text() for t in tokens)
    assert f"user me (admin) added to {path}" in first.stderr


def test_token_new_refuses_a_name_twice_and_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    assert token_new("--name", "me", "--role", "admin", "--tokens-file", str(path)).exit_code == 0
    before = path.read_text()
    again = token_new("--name", "me", "--role", "developer", "--tokens-file", str(path))
    assert again.exit_code == 1
    assert f"{path}: user 'me' exists already; choose another name" in again.stderr
    assert path.read_text() == before
    broken = tmp_path / "broken.yaml"
    broken.write_text("- name: x\n")
    refused = token_new("--name", "me", "--role", "admin", "--tokens-file", str(broken))
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: {broken}: expected a mapping with the key users "
        "(users: [{name, roles, token_sha256}]), found a list\n"
    )
    assert broken.read_text() == "- name: x\n"


def test_token_new_says_a_running_engine_takes_the_user_and_how_to_name_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.yaml"
    added = token_new("--name", "me", "--role", "admin", "--tokens-file", str(path))
    assert added.stderr == (
        f"user me (admin) added to {path}; a running engine with this api.tokens_file accepts "
        "the token at once (it watches the file)\n"
    )
    nameless = token_new("--role", "admin", "--tokens-file", str(path))
    assert nameless.exit_code == 2
    assert (
        "Error: Missing option '--name': the new user's name, which the audit records with "
        "each of their requests (gpuops token new --name alice --role admin --tokens-file "
        "var/api-tokens.yaml)"
    ) in nameless.stderr
