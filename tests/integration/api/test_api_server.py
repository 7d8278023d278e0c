"""The API as ``gpuops engine run`` serves it: TLS from a configured certificate and key (a
self-signed one made by openssl), and users reloaded on SIGHUP."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sources.promproc import free_port
from tests.builders import USERS, write_tokens
from tests.integration.api.harness import RULES, running_api
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

STARTUP_S = 180.0
"""The most a started ``gpuops engine run`` may take to serve its API (a loaded machine)."""


def self_signed(tmp: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_with_a_configured_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls = {"tls_cert_file": cert, "tls_key_file": key}
    with running_api(tmp_path / "engine", api=tls) as api:
        assert api.url.startswith("https://127.0.0.1:")
        with requests.Session() as session:
            headers = {"Authorization": f"Bearer {api.tokens['auditor']}"}
            ok = session.get(f"{api.url}/api/v1/engine", headers=headers, verify=str(cert))
            assert ok.status_code == 200
            with pytest.raises(requests.exceptions.SSLError):
                session.get(f"{api.url}/api/v1/engine", headers=headers, timeout=5)
            plain = api.url.replace("https://", "http://")
            with pytest.raises(requests.exceptions.ConnectionError):
                session.get(f"{plain}/api/v1/engine", headers=headers, timeout=5)
        result = CliRunner().invoke(
            cli,
            ["control", "status", "--json", "--ca-file", str(cert)],
            env={"GPUOPS_URL": api.url, "GPUOPS_TOKEN": api.tokens["auditor"]},
        )
        assert result.exit_code == 0, result.output
        assert '"paused": false' in result.stdout


def test_engine_run_serves_the_api_and_reloads_users_on_sighup(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "api-test.yaml").write_text(RULES)
    tokens = {role: f"{role}-token-0123456789" for role in USERS}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    port = free_port()
    config = {
        "prometheus": {"url": f"http://127.0.0.1:{free_port()}"},
        "rules": ["rules"],
        "state_file": "state.sqlite",
        "audit": {"spool_dir": "audit"},
        "metrics_listen": None,
        "api": {"listen": f"127.0.0.1:{port}", "tokens_file": "tokens.yaml"},
    }
    (tmp_path / "engine.yaml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "engine.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpuops.cli import main; main()", "engine", "run"]
        + ["--config", str(tmp_path / "engine.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def status(role: str) -> int:
            """The answer's status; 0 while the engine is not serving yet (not listening, or
            too busy to answer in time on a loaded machine); fails at once if it exited."""
            headers = {"Authorization": f"Bearer {tokens[role]}"}
            try:
                return requests.get(f"{url}/api/v1/rules", headers=headers, timeout=10).status_code
            except (requests.ConnectionError, requests.Timeout):
                assert proc.poll() is None, (tmp_path / "engine.log").read_text()
                return 0

        # Bounds for a loaded 2-core machine: the CLI's start alone takes several seconds
        # there (7 s at load 3.5, 30 s and more at load 14); waiting ends as soon as it serves.
        wait_for(lambda: status("developer") == 200, STARTUP_S, "the engine's API")
        write_tokens(tmp_path / "tokens.yaml", tokens, roles=["admin"])
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: status("developer") == 401, 60, "the removed user to be refused")
        assert status("admin") == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "engine.log").read_text()
    assert not any(token in text for token in tokens.values())
    assert "reloading rules and API users" in text
    assert f"API at {url}/api/v1" in text
    assert f"web console at {url}/ (sign in with an API token)" in text
