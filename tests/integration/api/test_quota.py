"""Quota requests: file → approve → applied by the executor → undone at expiry; deny, expiry
of unapproved requests, limits, the kill switch, persistence across a restart, and a boolean
or a string that is no number of GPUs."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuops.model.decisions import Sample, freeze
from gpuops.settings import GuardrailSettings, QuotaSettings
from gpuops.store.interface import QuotaStatus
from tests.integration.api.harness import Harness, running_api


class FakeFleet:
    """The fleet control API's scale endpoints on a loopback port: records each call."""

    def __init__(self) -> None:
        calls: list[tuple[str, dict[str, Any]]] = []
        self.calls = calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append((self.path, body))
                out = json.dumps({"changed": {"nodes": body["nodes"]}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever)

    def __enter__(self) -> FakeFleet:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def fleet() -> Iterator[FakeFleet]:
    with FakeFleet() as fake:
        yield fake


def _settings(**kw: Any) -> QuotaSettings:
    return QuotaSettings(executor="fleet", gpus_per_node=4, pool="a100", check_interval=3600, **kw)


def _submit(api: Harness, gpus: int = 5, duration: str = "8h") -> dict[str, Any]:
    resp = api.call(
        "developer",
        "POST",
        "/api/v1/quota-requests",
        json={"project": "vision", "gpus": gpus, "duration": duration, "reason": "deadline"},
    )
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_approved_request_scales_out_and_is_undone_at_expiry(
    tmp_path: Path, fleet: FakeFleet
) -> None:
    executors = {"fleet": {"url": fleet.url}}
    with running_api(tmp_path, quota=_settings(), executors=executors) as api:
        filed = _submit(api)
        assert filed["status"] == "pending" and filed["nodes"] == 2
        assert filed["requested_by"] == "dave"
        assert fleet.calls == []
        approved = api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve")
        body = approved.json()
        assert body["status"] == "active", body
        assert body["ends_at"] == pytest.approx(api.clock.now + 8 * 3600)
        assert fleet.calls == [("/api/v1/pools/a100/scale_out", fleet.calls[0][1])]
        assert fleet.calls[0][1]["nodes"] == 2
        quota = api.context.quota
        api.clock.advance(8 * 3600 - 1)
        quota.tick()
        assert len(fleet.calls) == 1
        api.clock.advance(2)
        quota.tick()
        assert [path for path, _ in fleet.calls] == [
            "/api/v1/pools/a100/scale_out",
            "/api/v1/pools/a100/scale_in",
        ]
        shown = api.call("auditor", "GET", f"/api/v1/quota-requests/{filed['id']}").json()
        assert shown["status"] == "ended"
        decisions = api.call(
            "auditor", "GET", "/api/v1/decisions", params={"policy": "quota-request"}
        )
        kinds = [(d["transition"], d["action"]["type"]) for d in decisions.json()["decisions"]]
        assert kinds == [("clear", "scale_in"), ("fire", "scale_out")]
        audited = [
            (d["gpuops"]["transition"], d["event"]["outcome"])
            for d in api.audit()
            if d["event"]["dataset"] == "gpuops.decision"
            and d.get("rule", {}).get("name") == "quota-request"
        ]
        # write-ahead: each action's intent is in the spool before its outcome
        assert audited == [
            ("fire", "unknown"),
            ("fire", "success"),
            ("clear", "unknown"),
            ("clear", "success"),
        ]


def test_active_request_survives_a_restart_and_still_ends(tmp_path: Path, fleet: FakeFleet) -> None:
    executors = {"fleet": {"url": fleet.url}}
    with running_api(tmp_path, quota=_settings(), executors=executors) as api:
        filed = _submit(api, gpus=1, duration="1h")
        api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve")
        ends_at = api.clock.now + 3600
    with running_api(tmp_path, quota=_settings(), executors=executors) as api:
        active = api.call("auditor", "GET", "/api/v1/quota-requests", params={"status": "active"})
        assert [r["id"] for r in active.json()["requests"]] == [filed["id"]]
        api.clock.now = ends_at + 1
        api.context.quota.tick()
        assert [path.rsplit("/", 1)[1] for path, _ in fleet.calls] == ["scale_out", "scale_in"]


def test_deny_expire_and_limits(api: Harness) -> None:
    denied = _submit(api)
    resp = api.call("admin", "POST", f"/api/v1/quota-requests/{denied['id']}/deny")
    assert resp.json()["status"] == "denied" and resp.json()["decided_by"] == "alice"
    again = api.call("admin", "POST", f"/api/v1/quota-requests/{denied['id']}/approve")
    assert again.status_code == 409
    assert again.json()["detail"] == f"quota request {denied['id']} is denied, not pending"
    stale = _submit(api)
    api.clock.advance(api.engine.config.guardrails.approval_ttl + 1)
    late = api.call("admin", "POST", f"/api/v1/quota-requests/{stale['id']}/approve")
    assert late.status_code == 409 and "expired" in late.json()["detail"]
    too_many = api.call(
        "developer",
        "POST",
        "/api/v1/quota-requests",
        json={"project": "x", "gpus": 1000, "duration": "1h"},
    )
    assert too_many.status_code == 422
    assert too_many.json()["detail"] == "gpus: 1000 is more than the limit of 64"
    bad_duration = api.call(
        "developer",
        "POST",
        "/api/v1/quota-requests",
        json={"project": "x", "gpus": 1, "duration": "soon"},
    )
    assert bad_duration.status_code == 422 and "not a duration" in bad_duration.json()["detail"]
    missing = api.call("admin", "POST", "/api/v1/quota-requests/q404/approve")
    assert missing.status_code == 404 and missing.json() == {"detail": "no quota request q404"}


def test_kill_switch_blocks_approval_and_holds_the_undo(api: Harness) -> None:
    filed = _submit(api, duration="1h")
    api.engine.set_control("kill_switch", True, "test")
    blocked = api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve")
    assert blocked.status_code == 409 and "kill switch" in blocked.json()["detail"]
    api.engine.set_control("kill_switch", False, "test")
    assert (
        api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve").json()["status"]
        == "active"
    )
    api.engine.set_control("kill_switch", True, "test")
    api.clock.advance(3601)
    quota = api.context.quota
    quota.tick()
    held = quota.get(filed["id"])
    assert held.status == "releasing" and "kill switch" in (held.error or "")
    assert api.executed("quota-request") == [api.executed("quota-request")[0]]  # the grant only
    api.engine.set_control("kill_switch", False, "test")
    quota.tick()
    assert quota.get(filed["id"]).status == "ended"


def test_failed_apply_is_reported_not_hidden(tmp_path: Path) -> None:
    executors = {"fleet": {"url": "http://127.0.0.1:9", "timeout_s": 0.5}}
    with running_api(tmp_path, quota=_settings(), executors=executors) as api:
        filed = _submit(api)
        resp = api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve")
        body = resp.json()
        assert body["status"] == "failed"
        assert "unreachable" in body["error"]


def test_a_request_approved_in_dry_run_shows_it_was_not_applied(
    tmp_path: Path, fleet: FakeFleet
) -> None:
    executors = {"fleet": {"url": fleet.url}}
    dry_run = GuardrailSettings(dry_run=True)
    with running_api(tmp_path, quota=_settings(), executors=executors, guardrails=dry_run) as api:
        filed = _submit(api, gpus=1, duration="1h")
        body = api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve").json()
        assert body["status"] == "dry_run", body
        assert body["decided_by"] == "alice" and body["error"] is None
        assert body["ends_at"] == pytest.approx(api.clock.now + 3600)
        assert fleet.calls == []
        decisions = api.call(
            "auditor", "GET", "/api/v1/decisions", params={"policy": "quota-request"}
        ).json()["decisions"]
        assert [(d["id"], d["verdict"]) for d in decisions] == [(body["grant_decision"], "dry_run")]
        listed = api.call(
            "auditor", "GET", "/api/v1/quota-requests", params={"status": "active"}
        ).json()["requests"]
        assert listed == []
        ends_at = api.clock.now + 3600
    # dry-run turned off within its period: never applied later, and nothing undone at its end
    with running_api(tmp_path, quota=_settings(), executors=executors) as api:
        quota = api.context.quota
        quota.tick()
        shown = api.call(
            "auditor", "GET", "/api/v1/quota-requests", params={"status": "dry_run"}
        ).json()["requests"]
        assert [r["id"] for r in shown] == [filed["id"]]
        api.clock.now = ends_at + 1
        quota.tick()
        assert quota.get(filed["id"]).status == "ended"
        assert fleet.calls == []
        stored = api.engine.store.decisions("quota-request", 0, 10)
        assert [d.decision.transition for d in stored] == ["fire"]


def test_a_request_an_older_engine_stored_active_in_dry_run_is_not_undone(
    tmp_path: Path, fleet: FakeFleet
) -> None:
    """An engine before the ``dry_run`` status stored a grant judged dry-run as ``active``:
    ticked by this one, it shows ``dry_run`` and its end undoes nothing."""
    executors = {"fleet": {"url": fleet.url}}
    dry_run = GuardrailSettings(dry_run=True)
    with running_api(tmp_path, quota=_settings(), executors=executors, guardrails=dry_run) as api:
        filed = _submit(api, gpus=1, duration="1h")
        body = api.call("admin", "POST", f"/api/v1/quota-requests/{filed['id']}/approve").json()
        store = api.engine.store
        request = api.context.quota.get(filed["id"])
        moved = replace(request, status=QuotaStatus.ACTIVE)
        assert store.move_quota_request(moved, QuotaStatus.DRY_RUN)
        ends_at = body["ends_at"]
    with running_api(tmp_path, quota=_settings(), executors=executors) as api:
        quota = api.context.quota
        quota.tick()
        assert quota.get(filed["id"]).status == "dry_run"
        api.clock.now = ends_at + 1
        quota.tick()
        assert quota.get(filed["id"]).status == "ended"
        assert fleet.calls == []


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            {"project": "ml", "gpus": True, "duration": "1h"},
            "body.gpus: Input should be a valid integer",
        ),
        (
            {"project": "ml", "gpus": "2", "duration": "1h"},
            "body.gpus: Input should be a valid integer",
        ),
        (
            {"project": "ml", "gpus": 2, "duration": True},
            "body.duration: Value error, must be a duration (seconds, or such as 8h), not a "
            "boolean",
        ),
    ],
)
def test_a_boolean_or_a_string_is_no_number_of_gpus(
    api: Harness, body: dict[str, object], where: str
) -> None:
    resp = api.call("developer", "POST", "/api/v1/quota-requests", json=body)
    assert resp.status_code == 422
    assert resp.json()["detail"] == where


def _ask(api: Harness, role: str, project: str, gpus: int) -> dict[str, Any]:
    resp = api.call(
        role,
        "POST",
        "/api/v1/quota-requests",
        json={"project": project, "gpus": gpus, "duration": "8h", "reason": "deadline"},
    )
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_an_admin_approves_their_own_request_only_when_configured(tmp_path: Path) -> None:
    with running_api(tmp_path / "default", quota=QuotaSettings(check_interval=3600)) as api:
        own = _ask(api, "admin", "vision", 8)
        refused = api.call("admin", "POST", f"/api/v1/quota-requests/{own['id']}/approve")
        assert refused.status_code == 409
        assert refused.json()["detail"] == (
            f"quota request {own['id']} was filed by alice: another admin approves it "
            "(api.quota.self_approval: true lets an admin approve their own)"
        )
        assert api.engine.quota.get(own["id"]).status is QuotaStatus.PENDING
        withdrawn = api.call("admin", "POST", f"/api/v1/quota-requests/{own['id']}/deny")
        assert withdrawn.json()["status"] == "denied"
    allowed = QuotaSettings(check_interval=3600, self_approval=True)
    with running_api(tmp_path / "allowed", quota=allowed) as api:
        own = _ask(api, "admin", "vision", 8)
        approved = api.call("admin", "POST", f"/api/v1/quota-requests/{own['id']}/approve")
        assert approved.json()["status"] == "active"


class Usage:
    """A Prometheus answering the quota usage query: GPUs held per project (and one series
    without a project, which counts for none)."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        assert expr == QuotaSettings().usage_query
        held = {"vision": 12.0, "speech": 3.0, "": 5.0}
        return tuple(Sample(freeze({"project": p}), v, 0.0) for p, v in held.items())


def test_projects_show_their_quota_grants_usage_and_pending_requests(tmp_path: Path) -> None:
    settings = QuotaSettings(check_interval=3600, projects={"vision": 8, "speech": 4})
    with running_api(tmp_path, quota=settings) as api:
        unknown = api.call(
            "developer",
            "POST",
            "/api/v1/quota-requests",
            json={"project": "visoin", "gpus": 1, "duration": "1h"},
        )
        assert unknown.status_code == 422
        assert unknown.json()["detail"] == (
            "project: 'visoin' is not one of the projects of api.quota.projects (speech, vision)"
        )
        granted = _ask(api, "developer", "vision", 8)
        api.call("admin", "POST", f"/api/v1/quota-requests/{granted['id']}/approve")
        _ask(api, "developer", "speech", 2)
        without = api.call("auditor", "GET", "/api/v1/quota-projects").json()
        assert without["usage_error"].startswith("usage not known: ")
        api.engine.prometheus = Usage()  # type: ignore[assignment]
        listed = api.call("auditor", "GET", "/api/v1/quota-projects").json()
    assert listed == {
        "projects": [
            {"name": "speech", "base": 4, "granted": 0, "quota": 4, "usage": 3.0, "pending": 1},
            {"name": "vision", "base": 8, "granted": 8, "quota": 16, "usage": 12.0, "pending": 0},
        ],
        "usage_error": None,
    }
