"""Decisions (query, explain), approvals (list, grant, deny, expiry), engine controls, health and
metrics — with decisions made by the real engine from Alertmanager alerts."""

from __future__ import annotations

import socket
from typing import Any

from tests.integration.api.harness import Harness


def _fire(api: Harness, name: str, **labels: str) -> None:
    assert api.notify(api.alert(name, **labels)).status_code == 200
    api.settle()


def _decisions(api: Harness, **params: Any) -> list[dict[str, Any]]:
    resp = api.call("auditor", "GET", "/api/v1/decisions", params=params)
    assert resp.status_code == 200, resp.text
    decisions: list[dict[str, Any]] = resp.json()["decisions"]
    return decisions


def test_query_decisions_with_filters(api: Harness) -> None:
    _fire(api, "GPUFellOffBus", node="n1")
    _fire(api, "GPUIdle", node="n2", uuid="GPU-2")
    assert len(_decisions(api)) == 2
    [drain] = _decisions(api, policy="drain-on-gpu-fell-off-bus")
    assert drain["verdict"] == "execute" and drain["outcome"]["status"] == "success"
    [waiting] = _decisions(api, verdict="awaiting_approval")
    assert waiting["target"]["labels"] == {"node": "n2", "uuid": "GPU-2"}
    assert [d["target"]["key"] for d in _decisions(api, target="n1")] == ["node=n1"]
    assert _decisions(api, transition="clear") == []
    assert _decisions(api, since=api.clock.now + 1) == []
    assert _decisions(api, until=api.clock.now - 1) == []
    assert len(_decisions(api, limit=1)) == 1
    bad = api.call("auditor", "GET", "/api/v1/decisions", params={"limit": 0})
    assert bad.status_code == 422 and "query.limit" in bad.json()["detail"]


def test_explain_names_policy_expr_evidence_and_guardrails(api: Harness) -> None:
    _fire(api, "GPUIdle", node="n2", uuid="GPU-2")
    [waiting] = _decisions(api)
    explained = api.call("auditor", "GET", f"/api/v1/decisions/{waiting['id']}/explain").json()
    assert explained["policy"]["name"] == "reclaim-with-approval"
    assert explained["expr"] == "alertmanager: GPUIdle"
    assert explained["evidence"]["pending_since"] is not None
    assert explained["guardrails"]["verdict"] == "awaiting_approval"
    assert explained["guardrails"]["executed"] is False
    assert explained["approval"]["status"] == "pending"
    assert explained["explanation"][0] == (
        "policy reclaim-with-approval decided to reclaim on node=n2,uuid=GPU-2"
    )
    # waiting for approval: stored as ``done`` (it runs nothing yet), never told so
    assert explained["status"] == "done" and explained["state"] == "waiting for approval"
    assert waiting["state"] == "waiting for approval" and waiting["effect"] == ""
    # one decision read alone is told as the list tells it
    shown = api.call("auditor", "GET", f"/api/v1/decisions/{waiting['id']}").json()
    assert shown["state"] == "waiting for approval" and shown["effect"] == ""
    missing = api.call("auditor", "GET", "/api/v1/decisions/abc/explain")
    assert missing.status_code == 404 and missing.json() == {"detail": "no decision abc"}


def test_grant_runs_the_action_once(api: Harness) -> None:
    _fire(api, "GPUIdle", node="n2", uuid="GPU-2")
    [pending] = api.call("developer", "GET", "/api/v1/approvals").json()["approvals"]
    decision_id = pending["decision_id"]
    granted = api.call("admin", "POST", f"/api/v1/approvals/{decision_id}/grant")
    assert granted.status_code == 200, granted.text
    assert granted.json()["reason"].startswith("approved by alice")
    api.engine.wait_idle(10)
    assert [o.status.value for o in api.executed("reclaim-with-approval")] == ["success"]
    again = api.call("admin", "POST", f"/api/v1/approvals/{decision_id}/grant")
    assert again.status_code == 409
    assert again.json()["detail"] == f"decision {decision_id} is granted, not pending"
    [settled] = api.call(
        "auditor", "GET", "/api/v1/approvals", params={"status": "granted"}
    ).json()["approvals"]
    assert settled["decided_by"] == "alice"


def test_deny_and_unknown_approvals(api: Harness) -> None:
    _fire(api, "GPUIdle", node="n2", uuid="GPU-2")
    [pending] = api.call("admin", "GET", "/api/v1/approvals").json()["approvals"]
    denied = api.call("admin", "POST", f"/api/v1/approvals/{pending['decision_id']}/deny")
    assert denied.json()["verdict"] == "suppressed:denied"
    assert api.executed("reclaim-with-approval") == []
    # not "held": no guardrail held it, an admin said no
    [shown] = api.call("auditor", "GET", "/api/v1/decisions").json()["decisions"]
    assert (shown["id"], shown["state"]) == (pending["decision_id"], "denied")
    for verb in ("grant", "deny"):
        resp = api.call("admin", "POST", f"/api/v1/approvals/feedbeef/{verb}")
        assert resp.status_code == 404, resp.text


def test_approvals_expire(api: Harness) -> None:
    _fire(api, "GPUIdle", node="n2", uuid="GPU-2")
    api.clock.advance(api.engine.config.guardrails.approval_ttl + 1)
    [expired] = api.call("auditor", "GET", "/api/v1/approvals").json()["approvals"]
    assert expired["status"] == "expired"
    [shown] = api.call("auditor", "GET", "/api/v1/decisions").json()["decisions"]
    assert (shown["id"], shown["state"]) == (expired["decision_id"], "expired")
    late = api.call("admin", "POST", f"/api/v1/approvals/{expired['decision_id']}/grant")
    assert late.status_code == 409 and "expired" in late.json()["detail"]


def test_kill_switch_and_pause(api: Harness) -> None:
    on = api.call("admin", "POST", "/api/v1/engine/kill-switch/on").json()
    assert on["kill_switch"] is True and api.engine.kill_switch_on()
    _fire(api, "GPUFellOffBus", node="n1")
    [suppressed] = _decisions(api)
    assert suppressed["verdict"].startswith("suppressed:")
    assert (
        api.call("admin", "POST", "/api/v1/engine/kill-switch/off").json()["kill_switch"] is False
    )
    assert api.call("admin", "POST", "/api/v1/engine/pause").json()["paused"] is True
    assert api.call("auditor", "GET", "/api/v1/engine").json()["paused"] is True
    assert api.call("admin", "POST", "/api/v1/engine/resume").json()["paused"] is False
    bad = api.call("admin", "POST", "/api/v1/engine/kill-switch/maybe")
    assert bad.status_code == 422 and "path.state" in bad.json()["detail"]


def test_every_call_is_audited_changes_and_refusals_as_documents_reads_counted(
    api: Harness,
) -> None:
    api.call("admin", "POST", "/api/v1/engine/pause")
    for _ in range(3):
        assert api.call("auditor", "GET", "/api/v1/decisions", params={"limit": 5}).ok
    assert api.call("developer", "GET", "/api/v1/audit").status_code == 403
    assert api.call("auditor", "GET", "/api/v1/audit", params={"since": "1h"}).ok
    docs = api.operations()
    assert [d["event"]["action"] for d in docs] == ["pause_engine", "search_audit", "search_audit"]
    pause, refused, searched = docs
    assert pause["user"] == {"name": "alice", "roles": ["admin"]}
    assert pause["event"]["type"] == ["change"] and pause["event"]["outcome"] == "success"
    assert refused["event"]["outcome"] == "failure" and refused["user"]["name"] == "dave"
    assert searched["event"]["type"] == ["access"]  # a search of the audit: an export
    assert searched["message"] == "audrey GET /api/v1/audit -> 200"
    metrics = api.call(None, "GET", "/metrics").text
    counted = 'gpuops_audit_reads_total{route="list_decisions",user="audrey",via="api"} 3.0'
    assert counted in metrics


def test_health_metrics_and_whoami(api: Harness) -> None:
    health = api.call(None, "GET", "/healthz")
    body = health.json()
    assert body.pop("leadership") == {"role": "leader", "replica": socket.gethostname()}
    assert body == {"status": "ok", "paused": False, "kill_switch": False}
    _fire(api, "GPUFellOffBus", node="n1")
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_api_alerts_total{result="handled"} 1.0' in metrics
    assert metrics.count("# HELP gpuops_engine_decisions_total ") == 1
    assert "# HELP gpuops_audit_" in metrics
    who = api.call("developer", "GET", "/api/v1/auth/whoami").json()
    assert who["name"] == "dave" and "quota:request" in who["permissions"]
    assert "approvals:decide" not in who["permissions"]
    metrics = api.call(None, "GET", "/metrics").text  # a read: counted, not a document
    assert 'gpuops_audit_reads_total{route="whoami",user="dave",via="api"} 1.0' in metrics
