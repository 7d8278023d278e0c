"""The README's way to a first ``gpuops decisions list``: ``gpuops engine run`` with a bad API
configuration (tokens file missing or broken, port in use, certificate missing) and a metrics
port in use fail before it evaluates anything. ``gpuops token new``:
tests/unit/cli/test_token_new.py."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

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
    assert in_use.stderr.splitlines()[-2:] == [
        f"Error: API not started, engine stopped: API cannot listen on 127.0.0.1:{port}: Address"
        " already in use",
        f"set another port in api.listen of {config}",
    ]
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


def test_a_metrics_port_in_use_stops_the_engine_before_it_evaluates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = engine_dir(tmp_path, {})
        text = config.read_text().replace(
            "metrics_listen: null", f"metrics_listen: 127.0.0.1:{port}"
        )
        config.write_text(text)
        in_use = run_engine(config, caplog)
    assert in_use.exit_code == 1
    assert in_use.stderr.splitlines()[-1] == (
        f"Error: engine metrics cannot listen on 127.0.0.1:{port}: Address already in use; set"
        f" another port in metrics_listen of {config} (null: no metrics listener)"
    )
    assert nothing_evaluated(tmp_path, caplog)


def test_an_executor_that_cannot_be_built_stops_the_engine_before_it_evaluates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = engine_dir(tmp_path, {"listen": None})
    settings = yaml.safe_load(config.read_text())
    token = tmp_path / "absent" / "agent-token"
    settings["executors"] = {
        "gpu-control": {"use": "nvml-agent"},
        "nvml-agent": {"token_file": str(token)},
    }
    config.write_text(yaml.safe_dump(settings))
    result = run_engine(config, caplog)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {config}: an executor cannot be built, engine not started:\n"
        f"executors.nvml-agent settings: token_file: '{token}' cannot be read: "
        "No such file or directory\n"
    )
    assert nothing_evaluated(tmp_path, caplog)
