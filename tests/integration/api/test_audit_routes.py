"""``GET /api/v1/audit``: auditors (and admins) search the audit trail; developers may not."""

from __future__ import annotations

from tests.integration.api.harness import Harness


def test_auditor_searches_user_operations(api: Harness) -> None:
    api.call("developer", "POST", "/api/v1/engine/pause")  # denied, and audited
    resp = api.call("auditor", "GET", "/api/v1/audit", params={"user": "dave", "stream": "audit"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["count"] >= 1
    assert {d["user"]["name"] for d in body["documents"]} == {"dave"}
    assert any(d["event"]["outcome"] == "failure" for d in body["documents"])


def test_outcome_filter_and_limit(api: Harness) -> None:
    for _ in range(3):
        api.call("developer", "POST", "/api/v1/engine/pause")
    resp = api.call(
        "admin",
        "GET",
        "/api/v1/audit",
        params={"outcome": "failure", "limit": 2, "stream": "audit"},
    )
    assert resp.status_code == 200, resp.text
    docs = resp.json()["documents"]
    assert len(docs) == 2 and all(d["event"]["outcome"] == "failure" for d in docs)


def test_developer_may_not_read_the_audit(api: Harness) -> None:
    resp = api.call("developer", "GET", "/api/v1/audit")
    assert resp.status_code == 403
    assert "lacks the permission audit:read" in resp.json()["detail"]


def test_bad_criteria_are_4xx_with_a_reason(api: Harness) -> None:
    resp = api.call("auditor", "GET", "/api/v1/audit", params={"label": "no-equals-sign"})
    assert resp.status_code == 422
    assert "is not NAME=VALUE" in resp.text
    resp = api.call("auditor", "GET", "/api/v1/audit", params={"since": "yesterday"})
    assert resp.status_code == 422
    assert "since:" in resp.text
