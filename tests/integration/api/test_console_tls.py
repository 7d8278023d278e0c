"""The console over TLS (a self-signed certificate made by openssl): its cookies are Secure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

from tests.integration.api.harness import running_api
from tests.integration.api.test_api_server import self_signed

pytestmark = pytest.mark.integration


def test_console_cookies_are_secure_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with running_api(tmp_path / "engine", api={"tls_cert_file": cert, "tls_key_file": key}) as api:
        with requests.Session() as session:
            ca = str(cert)  # per request: REQUESTS_CA_BUNDLE would win over session.verify
            page = session.get(f"{api.url}/login", timeout=10, verify=ca)
            assert "Secure" in page.headers["set-cookie"]
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf
            answer = session.post(
                f"{api.url}/login",
                data={"token": api.tokens["admin"], "csrf": csrf.group(1)},
                allow_redirects=False,
                timeout=10,
                verify=ca,
            )
            assert answer.status_code == 303
            cookie = answer.headers["set-cookie"]
            assert "gpuops_session=" in cookie and "Secure" in cookie and "HttpOnly" in cookie
            assert session.get(f"{api.url}/", timeout=10, verify=ca).status_code == 200
