"""The console without a browser: sessions (expiry, removed users), where sign-in may send the
browser next, link encoding, the CSV export's formula guard, and the console switched off.
The browser tests (tests/browser) cover the pages themselves."""

from __future__ import annotations

import csv
import io
import logging
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
import requests

from gpuops.api.console.pages import _csv
from gpuops.api.console.sessions import SessionStore, SignInLimiter
from gpuops.api.console.web import grafana_link, kibana_link
from gpuops.api.tokens import TokenStore
from gpuops.settings import ConsoleSettings
from tests.unit.api.harness import Harness, running_api, write_tokens


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


def test_sessions_expire_and_end_with_their_user(tmp_path: Path) -> None:
    tokens = {"admin": "admin-token-0123456789", "developer": "dev-token-0123456789"}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    store = TokenStore(tmp_path / "tokens.yaml", environ={})
    store.reload()
    now = [1000.0]
    sessions = SessionStore(store, ttl=60, clock=lambda: now[0])
    assert sessions.sign_in("wrong") is None
    admin = sessions.sign_in(tokens["admin"])
    dev = sessions.sign_in(tokens["developer"])
    assert admin and dev
    found = sessions.find(admin[0])
    assert found and found[1].name == "alice" and found[1].roles == ("admin",)
    assert admin[1].csrf != dev[1].csrf and admin[0] != dev[0]
    write_tokens(tmp_path / "tokens.yaml", tokens, roles=["admin"])
    store.reload()
    assert sessions.find(dev[0]) is None  # the user was removed: their session ends at once
    now[0] += 60
    assert sessions.find(admin[0]) is None
    assert sessions.find("") is None and sessions.find(None) is None


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


def test_links_encode_the_labels() -> None:
    settings = ConsoleSettings(grafana_url="http://g:3000/", kibana_url="http://k:5601")
    link = grafana_link(settings, {"node": "a&b=c", "uuid": "GPU 1"})
    assert link == "http://g:3000/d/gpuops-gpu-fleet?var-node=a%26b%3Dc&var-uuid=GPU+1"
    kibana = kibana_link(settings, "node=x' OR '1\"")
    assert kibana is not None and kibana.startswith("http://k:5601/app/discover#/?_a=")
    state = unquote(kibana.split("_a=", 1)[1])
    assert state == "(query:(language:kuery,query:'gpuops.target.key : \"node=x!' OR !'1\\\"\"'))"
    assert grafana_link(ConsoleSettings(), {"node": "n"}) is None


def test_the_csv_export_quotes_what_a_spreadsheet_would_run() -> None:
    row = {k: "" for k in ("@timestamp", "dataset", "action", "outcome", "user", "roles")}
    row |= {"source_ip": "", "policy": "", "message": "=HYPERLINK(1)", "error": "-2+3"}
    text = _csv([row])
    assert "'=HYPERLINK(1)" in text and "'-2+3" in text


def test_the_csv_export_quotes_a_formula_behind_a_tab_or_line_break() -> None:
    # OWASP's list: = + - @, and tab and carriage return, which spreadsheets skip before one;
    # a bare carriage return must stay inside its quoted cell (else it ends the row there)
    row = {k: "" for k in ("@timestamp", "dataset", "action", "outcome", "user", "roles")}
    row |= {"source_ip": "\t=1+2", "policy": "\r=cmd|' /C calc'!A0", "message": "\n@SUM(1)"}
    row |= {"error": "plain"}
    rows = list(csv.reader(io.StringIO(_csv([row]), newline="")))
    assert len(rows) == 2, rows
    cells = rows[1]
    assert cells[6:] == ["'\t=1+2", "'\r=cmd|' /C calc'!A0", "'\n@SUM(1)", "plain"]


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


def test_the_sign_in_limiter_forgets_old_addresses() -> None:
    now = [0.0]
    limiter = SignInLimiter(2, 60, clock=lambda: now[0], max_addresses=100)
    for i in range(1000):
        limiter.failed(f"10.0.{i // 256}.{i % 256}")
        now[0] += 1
    assert len(limiter) <= 100
    limiter.failed("192.0.2.1")
    assert limiter.retry_after("192.0.2.1") is None
    limiter.failed("192.0.2.1")
    assert limiter.retry_after("192.0.2.1") == 60


def test_a_session_ends_when_its_token_is_replaced(tmp_path: Path) -> None:
    # the user stays, with a new token (the old one leaked): sessions made with the old one end
    tokens = {"admin": "admin-token-0123456789"}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    store = TokenStore(tmp_path / "tokens.yaml", environ={})
    store.reload()
    sessions = SessionStore(store, ttl=3600)
    old = sessions.sign_in(tokens["admin"])
    assert old and sessions.find(old[0])
    write_tokens(tmp_path / "tokens.yaml", {"admin": "rotated-token-9876543210"})
    store.reload()
    assert sessions.find(old[0]) is None
    new = sessions.sign_in("rotated-token-9876543210")
    assert new and sessions.find(new[0]) and new[2].name == "alice"


def test_one_user_signing_in_again_and_again_keeps_a_bounded_number_of_sessions(
    tmp_path: Path,
) -> None:
    tokens = {"admin": "admin-token-0123456789", "auditor": "auditor-token-0123456789"}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    store = TokenStore(tmp_path / "tokens.yaml", environ={})
    store.reload()
    sessions = SessionStore(store, ttl=3600, max_per_user=5)
    auditor = sessions.sign_in(tokens["auditor"])
    made = [sessions.sign_in(tokens["admin"]) for _ in range(1000)]
    assert len(sessions) == 6
    assert all(m and sessions.find(m[0]) for m in made[-5:])  # the newest five live
    assert not any(m and sessions.find(m[0]) for m in made[:-5])
    assert auditor and sessions.find(auditor[0])  # another user's session is not pushed out


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
        row = page[page.index("log-down-nodes</a>") :].split("</tr>")[0]
        assert "skipped: " in row and "not yet" not in row
