"""Authentication, roles and hostile input: 401/403 audited with user, source IP, path and
reason; tokens never stored or echoed in clear; path traversal and oversized bodies refused."""

from __future__ import annotations

import base64
import json

import pytest

from tests.builders import write_tokens
from tests.integration.api.harness import Harness

WRITES = [
    ("POST", "/api/v1/rules/reload"),
    ("PUT", "/api/v1/rule-files/new.yaml"),
    ("POST", "/api/v1/approvals/0123456789abcdef01234567/grant"),
    ("POST", "/api/v1/approvals/0123456789abcdef01234567/deny"),
    ("POST", "/api/v1/quota-requests/q0123/approve"),
    ("POST", "/api/v1/quota-requests/q0123/deny"),
    ("POST", "/api/v1/engine/pause"),
    ("POST", "/api/v1/engine/resume"),
    ("POST", "/api/v1/engine/kill-switch/on"),
    ("POST", "/api/v1/engine/kill-switch/off"),
    ("POST", "/api/v1/auth/reload"),
]


def test_no_token_is_401_and_audited_with_ip_path_and_reason(api: Harness) -> None:
    resp = api.call(None, "GET", "/api/v1/decisions")
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert "no credentials" in resp.json()["detail"]
    [doc] = api.operations()
    assert doc["event"]["action"] == "authenticate"
    assert doc["event"]["outcome"] == "failure"
    assert doc["user"]["name"] == "anonymous"
    assert doc["source"]["ip"] == "127.0.0.1"
    assert doc["gpuops"]["operation"]["details"]["path"] == "/api/v1/decisions"
    assert doc["error"]["message"].startswith("401: no credentials")


def test_bad_token_is_401_and_neither_it_nor_any_token_is_audited(api: Harness) -> None:
    resp = api.call(None, "GET", "/api/v1/rules", headers={"Authorization": "Bearer guess-me"})
    assert resp.status_code == 401
    assert resp.json() == {"detail": "invalid bearer token"}
    api.call("admin", "GET", "/api/v1/rules")
    spooled = "".join(json.dumps(d) for d in api.audit())
    assert "guess-me" not in spooled
    assert not any(token in spooled for token in api.tokens.values())
    assert "invalid bearer token" in spooled


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_developer_cannot_change_rules_approve_or_control(
    api: Harness, method: str, path: str
) -> None:
    resp = api.call("developer", method, path, data=b"groups: []")
    assert resp.status_code == 403, resp.text
    assert "user 'dave' (roles: developer) lacks the permission" in resp.json()["detail"]


def test_forbidden_call_is_audited_as_denied(api: Harness) -> None:
    api.call("developer", "POST", "/api/v1/approvals/0123456789abcdef01234567/grant")
    [doc] = api.operations()
    assert doc["event"]["action"] == "grant_approval"
    assert doc["event"]["outcome"] == "failure"
    assert "denied" in doc["event"]["type"]
    assert doc["user"] == {"name": "dave", "roles": ["developer"]}
    assert doc["error"]["message"].startswith("403: forbidden")
    assert doc["gpuops"]["operation"]["details"]["status"] == 403


def test_auditor_can_only_read(api: Harness) -> None:
    spec = api.call("auditor", "GET", "/api/v1/openapi.json").json()
    checked = 0
    for path, methods in spec["paths"].items():
        concrete = (
            path.replace("{name}", "x.yaml" if "rule-files" in path else "x")
            .replace("{decision_id}", "0123456789abcdef01234567")
            .replace("{request_id}", "q0123")
            .replace("{state}", "on")
        )
        for method in methods:
            resp = api.call("auditor", method.upper(), concrete, json={})
            if method == "get":
                assert resp.status_code in (200, 404), (path, resp.text)
            else:
                assert resp.status_code == 403, (method, path, resp.text)
            checked += 1
    assert checked >= 20
    assert not api.engine.paused() and not api.engine.kill_switch_on()


def test_developer_reads_and_files_quota_requests(api: Harness) -> None:
    assert api.call("developer", "GET", "/api/v1/decisions").status_code == 200
    assert api.call("developer", "POST", "/api/v1/rules/validate", data=b"groups: []").ok
    resp = api.call(
        "developer",
        "POST",
        "/api/v1/quota-requests",
        json={"project": "p", "gpus": 2, "duration": "1h"},
    )
    assert resp.status_code == 201, resp.text


def test_alertmanager_role_can_only_post_alerts(api: Harness) -> None:
    assert api.call("alertmanager", "GET", "/api/v1/decisions").status_code == 403
    assert api.notify().status_code == 200
    assert api.notify(role="developer").status_code == 403


def test_basic_auth_with_token_as_password(api: Harness) -> None:
    def basic(user: str, password: str) -> dict[str, str]:
        raw = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {raw}"}

    ok = api.call(None, "GET", "/api/v1/auth/whoami", headers=basic("alice", api.tokens["admin"]))
    assert ok.status_code == 200 and ok.json()["name"] == "alice"
    wrong_user = api.call(None, "GET", "/api/v1/rules", headers=basic("dave", api.tokens["admin"]))
    assert wrong_user.status_code == 401
    garbage = api.call(None, "GET", "/api/v1/rules", headers={"Authorization": "Basic %%%"})
    assert garbage.status_code == 401 and garbage.json()["detail"] == "malformed Basic credentials"


def test_a_token_sent_as_basic_user_name_is_never_audited(api: Harness) -> None:
    token = api.tokens["admin"]
    raw = base64.b64encode(f"{token}:x".encode()).decode()  # user name and password swapped
    resp = api.call(None, "GET", "/api/v1/rules", headers={"Authorization": f"Basic {raw}"})
    assert resp.status_code == 401
    (doc,) = api.operations()
    assert doc["user"]["name"] == "unknown"
    assert token not in json.dumps(api.audit())


def test_removed_user_token_stops_working_at_once(api: Harness) -> None:
    assert api.call("developer", "GET", "/api/v1/rules").status_code == 200
    write_tokens(api.tokens_file, api.tokens, roles=["admin", "auditor", "alertmanager"])
    # the engine watches the file: no reload needed
    assert api.call("developer", "GET", "/api/v1/rules").status_code == 401
    assert api.call("admin", "GET", "/api/v1/rules").status_code == 200
    resp = api.call("admin", "POST", "/api/v1/auth/reload")  # still there, for scripts
    assert resp.json() == {"users": 3}


def test_broken_tokens_file_keeps_the_current_users(api: Harness) -> None:
    api.tokens_file.write_text("users:\n  - {name: eve, roles: [root], token_sha256: plain}\n")
    resp = api.call("admin", "POST", "/api/v1/auth/reload")
    assert resp.status_code == 422
    assert "unknown role 'root'" in resp.json()["detail"]
    assert "plain" not in resp.text
    assert api.call("developer", "GET", "/api/v1/rules").status_code == 200


@pytest.mark.parametrize(
    "name",
    [
        "..%2F..%2Fetc%2Fpasswd",
        "%2E%2E%2Fapi-test.yaml",
        "..%5Cevil.yaml",
        ".hidden.yaml",
        "%2Ftmp%2Fevil.yaml",
        "evil.yaml%00.txt",
        "evil.txt",
    ],
)
def test_path_traversal_in_rule_file_names_is_refused(api: Harness, name: str) -> None:
    before = sorted(p.name for p in api.tmp.rglob("*.y*ml"))
    read = api.call("admin", "GET", f"/api/v1/rule-files/{name}")
    write = api.call("admin", "PUT", f"/api/v1/rule-files/{name}", data=b"groups: []\n")
    assert read.status_code in (404, 422) and write.status_code in (404, 405, 422)
    assert "detail" in read.json() and "detail" in write.json()
    assert sorted(p.name for p in api.tmp.rglob("*.y*ml")) == before
    assert not list(api.tmp.parent.rglob("evil*"))


@pytest.mark.parametrize("name", ["..", "..%2Fapi-test", "a%2F..%2F..%2Fb", "-x"])
def test_path_traversal_in_policy_names_is_refused(api: Harness, name: str) -> None:
    resp = api.call("admin", "GET", f"/api/v1/rules/{name}")
    assert resp.status_code in (404, 422)
    assert resp.json()["detail"]


def test_body_over_the_limit_is_413(api: Harness) -> None:
    big = b"#" * (api.context.settings.max_body_bytes + 1)
    resp = api.call("developer", "POST", "/api/v1/rules/validate", data=big)
    assert resp.status_code == 413
    assert "exceeds the limit" in resp.json()["detail"]

    def chunks() -> object:
        yield big[:1000]
        yield big

    chunked = api.call("developer", "POST", "/api/v1/rules/validate", data=chunks())
    assert chunked.status_code == 413
    assert "larger than" in chunked.json()["detail"]


def test_malformed_json_and_schema_violations_are_422_with_the_reason(api: Harness) -> None:
    bad_json = api.call(
        "developer",
        "POST",
        "/api/v1/quota-requests",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert bad_json.status_code == 422
    assert "JSON decode error" in bad_json.json()["detail"]
    wrong = api.call(
        "developer", "POST", "/api/v1/quota-requests", json={"project": "p", "gpus": 0}
    )
    assert wrong.status_code == 422
    detail = wrong.json()["detail"]
    assert "body.gpus: Input should be greater than or equal to 1" in detail
    assert "body.duration: Field required" in detail
    extra = api.call(
        "developer",
        "POST",
        "/api/v1/quota-requests",
        json={"project": "p", "gpus": 1, "duration": "1h", "admin": True},
    )
    assert extra.status_code == 422 and "body.admin: Extra inputs" in extra.json()["detail"]


def test_a_forwarded_for_header_does_not_change_the_audited_source_ip(api: Harness) -> None:
    # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: any local process could write
    # another address into the audit (and dodge the console's per-address sign-in limit)
    forged = {"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9"}
    assert api.call("admin", "POST", "/api/v1/engine/pause", headers=forged).status_code == 200
    assert api.call(None, "GET", "/api/v1/engine", headers=forged).status_code == 401
    sources = [d["source"]["ip"] for d in api.operations()]
    assert sources == ["127.0.0.1", "127.0.0.1"]
