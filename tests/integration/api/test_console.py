"""The console through the running API, without a browser: where sign-in may send the browser
next, sign-in refused after repeated failures, one session per browser, no token in a log or
the audit, framing, scripts and content sniffing refused, the body limit, a failing page, the
rules page, and the console switched off. Its parts alone: tests/unit/api/test_console.py; the
pages in a browser: tests/browser."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import requests

from gpuops.settings import ConsoleSettings
from tests.integration.api.harness import Harness, running_api


def sign_in(api: Harness, role: str, next_path: str = "/") -> requests.Response:
    page = api.session.get(f"{api.url}/login", timeout=10)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text
    return api.session.post(
        f"{api.url}/login",
        data={"token": api.tokens[role], "csrf": csrf.group(1), "next": next_path},
        allow_redirects=False,
        timeout=10,
    )


def test_sign_in_sends_the_browser_only_to_a_path_of_this_site(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        for asked, sent in [
            ("/audit?since=7d", "/audit?since=7d"),
            ("https://evil.example/", "/"),
            ("//evil.example/x", "/"),
            ("/\\evil.example", "/"),
        ]:
            api.session.cookies.clear()
            answer = sign_in(api, "auditor", asked)
            assert answer.status_code == 303 and answer.headers["location"] == sent, asked
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
        assert api.tokens["auditor"] not in cookie


def test_no_token_reaches_a_log_or_the_audit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with running_api(tmp_path) as api:
        assert sign_in(api, "admin").status_code == 303
        api.session.get(f"{api.url}/audit", timeout=10)
        page = api.session.get(f"{api.url}/login", timeout=10)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf
        wrong = api.session.post(
            f"{api.url}/login", data={"token": "guessed-token-42", "csrf": csrf.group(1)}
        )
        assert wrong.status_code == 401 and "guessed-token-42" not in wrong.text
        audit = str(api.audit())
    secrets = [*api.tokens.values(), "guessed-token-42"]
    assert not any(s in caplog.text or s in audit for s in secrets)
    assert "console_sign_in" in audit and "authenticate" in audit


def test_pages_refuse_framing_and_scripts(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        sign_in(api, "admin")
        page = api.session.get(f"{api.url}/", timeout=10)
        assert page.status_code == 200
        assert page.headers["x-frame-options"] == "DENY"
        assert "script-src 'none'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"
        assert "<script" not in page.text


def test_a_form_larger_than_the_body_limit_is_refused_unread(tmp_path: Path) -> None:
    with running_api(tmp_path, api={"max_body_bytes": 4096}) as api:
        sign_in(api, "developer")
        big = {"csrf": "x", "text": "a" * 5000}
        answer = api.session.post(f"{api.url}/rules/validate", data=big, timeout=10)
        assert answer.status_code == 413
        assert "exceed the limit of 4096 bytes" in answer.text
        refused = [d for d in api.operations() if d["event"]["action"] == "validate_rules"]
        assert refused[-1]["event"]["outcome"] == "failure"
        assert refused[-1]["user"]["name"] == "dave"


def test_the_console_can_be_switched_off(tmp_path: Path) -> None:
    with running_api(tmp_path, api={"console": ConsoleSettings(enabled=False)}) as api:
        assert api.session.get(f"{api.url}/login", timeout=10).status_code == 404
        assert api.session.get(f"{api.url}/api/v1/docs", timeout=10).status_code == 200
        assert api.call("auditor", "GET", "/api/v1/engine").status_code == 200


def _post_sign_in(api: Harness, token: str) -> requests.Response:
    page = api.session.get(f"{api.url}/login", timeout=10)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text
    data = {"token": token, "csrf": csrf.group(1)}
    return api.session.post(f"{api.url}/login", data=data, allow_redirects=False, timeout=10)


def test_sign_in_is_refused_for_a_while_after_repeated_failures_from_one_address(
    tmp_path: Path,
) -> None:
    limits = ConsoleSettings(sign_in_failures=3, sign_in_window=60)
    with running_api(tmp_path, api={"console": limits}) as api:
        assert [_post_sign_in(api, f"guess-{i}").status_code for i in range(3)] == [401] * 3
        held = _post_sign_in(api, api.tokens["admin"])  # even the right token, for now
        assert held.status_code == 429 and int(held.headers["retry-after"]) == 60
        assert "Too many failed sign-ins from 127.0.0.1" in held.text
        assert api.tokens["admin"] not in held.text and "gpuops_session" not in str(held.cookies)
        refused = [d for d in api.operations() if d["event"]["action"] == "authenticate"]
        assert len(refused) == 4 and refused[-1]["event"]["outcome"] == "failure"
        assert "429: too many failed sign-ins" in refused[-1]["error"]["message"]
        assert refused[-1]["source"]["ip"] == "127.0.0.1"
        api.clock.advance(61)
        assert _post_sign_in(api, api.tokens["admin"]).status_code == 303


def test_signing_in_again_ends_the_browser_s_previous_session(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        assert sign_in(api, "admin").status_code == 303
        first = api.session.cookies["gpuops_session"]
        assert sign_in(api, "auditor").status_code == 303
        assert api.session.cookies["gpuops_session"] != first
        stale = requests.get(
            f"{api.url}/", cookies={"gpuops_session": first}, allow_redirects=False, timeout=10
        )
        assert stale.status_code == 303 and stale.headers["location"].startswith("/login")


def test_a_page_asked_for_before_sign_in_is_shown_after_it_with_its_query(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        asked = api.session.get(
            f"{api.url}/audit?since=7d&user=dave", allow_redirects=False, timeout=10
        )
        assert asked.status_code == 303
        assert asked.headers["location"] == "/login?next=/audit%3Fsince%3D7d%26user%3Ddave"
        page = api.session.get(f"{api.url}{asked.headers['location']}", timeout=10)
        assert 'name="next" value="/audit?since=7d&amp;user=dave"' in page.text
        answer = sign_in(api, "auditor", "/audit?since=7d&user=dave")
        assert answer.headers["location"] == "/audit?since=7d&user=dave"


def test_pages_and_exports_forbid_content_sniffing(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        sign_in(api, "auditor")
        for path in ("/login", "/audit", "/audit/export.csv", "/audit/export.ndjson"):
            answer = api.session.get(f"{api.url}{path}", timeout=10)
            assert answer.status_code == 200, path
            assert answer.headers.get("x-content-type-options") == "nosniff", path


def test_a_page_that_fails_inside_is_a_500_page_and_still_audited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret-detail-42")

    monkeypatch.setattr("gpuops.api.console.pages.list_rules", broken)
    with running_api(tmp_path) as api:
        sign_in(api, "developer")
        answer = api.session.get(f"{api.url}/rules", timeout=10)
        assert answer.status_code == 500
        assert "internal error (RuntimeError)" in answer.text
        assert "secret-detail-42" not in answer.text
        [record] = [d for d in api.operations() if d["event"]["action"] == "list_rules"]
        assert record["event"]["outcome"] == "failure" and record["user"]["name"] == "dave"
        assert record["error"]["message"].startswith("500: internal error (RuntimeError)")


def test_the_rules_page_shows_the_last_evaluation_and_the_failed_reload(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        (api.tmp / "rules" / "extra.yaml").write_text(
            "groups:\n  - name: extra\n    rules:\n      - policy: log-down-nodes\n"
            "        expr: up == 0\n        action: {type: notify, executor: log}\n"
        )
        assert api.engine.reload().ok
        policy = api.engine.rules.policy("log-down-nodes")
        assert policy is not None
        api.engine.cycle.evaluate_policy(policy)  # no Prometheus answers: skipped
        (api.tmp / "rules" / "broken.yaml").write_text("groups: [")
        assert not api.engine.reload().ok
        sign_in(api, "developer")
        page = api.session.get(f"{api.url}/rules", timeout=10).text
        assert 'id="reload-errors"' in page and "broken.yaml:1: " in page
        row = page[page.index("log-down-nodes</a>") :].split("</section>")[0]
        assert "skipped: " in row and "not yet" not in row
        assert str(api.tmp) not in page  # files named as in the rules directory


def test_page_reads_are_counted_and_forms_exports_and_refusals_are_documents(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path) as api:
        sign_in(api, "auditor")
        for path in ("/", "/decisions", "/audit", "/audit"):
            assert api.session.get(f"{api.url}{path}", timeout=10).status_code == 200
        bad = api.session.get(f"{api.url}/decisions?transition=maybe", timeout=10)
        assert bad.status_code == 422
        export = api.session.get(f"{api.url}/audit/export.csv?since=1h", timeout=10)
        assert export.status_code == 200
        docs = api.operations()
        actions = [d["event"]["action"] for d in docs]
        assert "engine_status" not in actions and "search_audit" not in actions
        [refused] = [d for d in docs if d["event"]["action"] == "list_decisions"]
        assert refused["event"]["outcome"] == "failure" and "maybe" in refused["message"]
        assert actions.count("console_sign_in") == 1 and "search_audit_export" in actions
        metrics = api.call(None, "GET", "/metrics").text
        assert 'gpuops_audit_reads_total{route="search_audit",user="audrey",via="console"} 2.0' in (
            metrics
        )
        page = api.session.get(f"{api.url}/audit", timeout=10).text
        assert "Reads, counted" in page and "list_decisions" in page


def test_the_overview_shows_pending_quota_and_no_shipping_backlog_without_elasticsearch(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path) as api:
        asked = api.call(
            "developer",
            "POST",
            "/api/v1/quota-requests",
            json={"project": "vision", "gpus": 4, "duration": "2h", "reason": "deadline"},
        )
        assert asked.status_code == 201
        sign_in(api, "admin")
        page = api.session.get(f"{api.url}/", timeout=10).text
        pending = page[page.index('id="quota-pending"') :].split("</ul>")[0]
        assert "vision: 4 GPUs for 2.0 h" in pending and "asked by dave" in pending
        assert "not yet shipped" not in page
        assert "in the local spool (kept there: nothing ships them)" in page


def test_engine_rows_of_the_audit_name_the_engine_and_their_policy(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        assert api.notify(api.alert("GPUFellOffBus", node="n1")).status_code == 200
        api.settle()
        sign_in(api, "auditor")
        page = api.session.get(f"{api.url}/audit?stream=decision", timeout=10).text
        assert "engine (policy drain-on-gpu-fell-off-bus)" in page
