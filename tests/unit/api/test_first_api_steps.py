"""The README's way to a first ``gpuops decisions list``: ``gpuops token new`` writes a tokens
file the engine accepts, and ``gpuops engine run`` with a bad API configuration fails before it
evaluates anything."""

from __future__ import annotations

import logging
import socket
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from gpuops.api.tokens import TokenStore, hash_token, parse_users
from gpuops.cli import cli
from gpuops.sources.promproc import free_port

RULES = """\
groups:
  - name: g
    interval: 1s
    rules:
      - policy: p
        expr: up == 0
        action: {type: notify, executor: log}
"""


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


def engine_dir(tmp_path: Path, api: dict[str, object]) -> Path:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(RULES)
    config = {
        "prometheus": {"url": f"http://127.0.0.1:{free_port()}"},
        "rules": ["rules"],
        "state_file": "state.sqlite",
        "audit": {"spool_dir": "audit"},
        "metrics_listen": None,
        "api": api,
    }
    (tmp_path / "engine.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "engine.yaml"


def run_engine(config: Path, caplog: pytest.LogCaptureFixture) -> Result:
    with caplog.at_level(logging.INFO, logger="engine"):
        return CliRunner().invoke(cli, ["engine", "run", "--config", str(config)])


def nothing_evaluated(tmp: Path, caplog: pytest.LogCaptureFixture) -> bool:
    """No rules were loaded (the first step of starting) and nothing was audited."""
    loaded = [r for r in caplog.records if "policies in" in r.getMessage()]
    spooled = [p for p in (tmp / "audit").glob("**/*") if p.is_file() and p.stat().st_size]
    return not loaded and not spooled


def test_a_missing_tokens_file_stops_the_engine_before_it_evaluates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    config = engine_dir(tmp_path, {"listen": listen, "tokens_file": "api-tokens.yaml"})
    result = run_engine(config, caplog)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: API not started, engine stopped: {tmp_path}/api-tokens.yaml: cannot read: "
        "No such file or directory\n"
        f"make it: gpuops token new --name NAME --role admin --tokens-file "
        f"{tmp_path}/api-tokens.yaml\n"
    )
    assert nothing_evaluated(tmp_path, caplog)


def test_a_bad_tokens_file_stops_the_engine_before_it_evaluates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "tokens.yaml").write_text("- name: me\n  roles: [admin]\n")
    config = engine_dir(
        tmp_path, {"listen": f"127.0.0.1:{free_port()}", "tokens_file": "tokens.yaml"}
    )
    result = run_engine(config, caplog)
    assert result.exit_code == 1
    assert f"{tmp_path}/tokens.yaml: expected a mapping with the key users" in result.stderr
    assert nothing_evaluated(tmp_path, caplog)


def test_a_port_in_use_or_a_missing_certificate_stops_the_engine_before_it_evaluates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_new("--name", "me", "--role", "admin", "--tokens-file", str(tmp_path / "t.yaml"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = engine_dir(tmp_path, {"listen": f"127.0.0.1:{port}", "tokens_file": "t.yaml"})
        in_use = run_engine(config, caplog)
    assert in_use.exit_code == 1
    assert f"API cannot listen on 127.0.0.1:{port}" in in_use.stderr
    assert nothing_evaluated(tmp_path, caplog)
    tls = tmp_path / "tls"
    tls.mkdir()
    token_new("--name", "me", "--role", "admin", "--tokens-file", str(tls / "t.yaml"))
    api = {"listen": f"127.0.0.1:{free_port()}", "tokens_file": "t.yaml"}
    config = engine_dir(tls, {**api, "tls_cert_file": "cert.pem", "tls_key_file": "key.pem"})
    no_cert = run_engine(config, caplog)
    assert no_cert.exit_code == 1
    assert f"api.tls_cert_file: {tls}/cert.pem is not a readable file" in no_cert.stderr
    assert nothing_evaluated(tls, caplog)
