"""The web console in a real browser: per role what it may see and a clear refusal otherwise;
grant, deny, kill switch, quota, rules, audit; CSRF, session expiry, sign-out; keyboard and
labels; a screenshot of every page (``var/console-screenshots/``)."""

from __future__ import annotations

import csv
import io
import re

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from gpuops.api.console.web import when
from tests.browser.conftest import GRAFANA, KIBANA, shot, sign_in
from tests.integration.api.harness import Harness
from tests.waiting import wait_for

PAGES = {
    "Overview": "/",
    "Fleet": "/fleet",
    "Batch": "/batch",
    "Health": "/health",
    "Timeline": "/timeline",
    "Decisions": "/decisions",
    "Approvals": "/approvals",
    "Quota requests": "/quota",
    "Rules": "/rules",
    "Audit": "/audit",
}
ALLOWED = {
    "admin": set(PAGES),
    "developer": set(PAGES) - {"Audit"},
    "auditor": set(PAGES),
}


def pending_approval(console: Harness, node: str) -> str:
    """Fire the alert of the approval-required policy on ``node``; the decision id."""
    assert console.notify(console.alert("GPUIdle", node=node, uuid=f"GPU-{node}")).ok
    console.settle()
    found = [a for a in console.engine.store.approvals("pending") if f"node={node}" in a.target]
    assert len(found) == 1, found
    decision_id: str = found[0].decision_id
    return decision_id


def operations(console: Harness, action: str) -> list[dict[str, object]]:
    return [d for d in console.operations() if d["event"]["action"] == action]


def test_sign_in_gives_a_strict_http_only_session_and_never_shows_the_token(
    page: Page, context: BrowserContext, console: Harness
) -> None:
    page.goto("/decisions")
    expect(page).to_have_url(re.compile(r"/login\?next=/decisions$"))
    shot(page, "login")
    sign_in(page, console, "admin", "/login?next=/decisions")
    expect(page).to_have_url(re.compile(r"/decisions$"))
    expect(page.locator("header .who")).to_contain_text("alice (admin)")
    cookies = {c["name"]: c for c in context.cookies()}
    session = cookies["gpuops_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert not session["secure"]  # plain HTTP here; over TLS it is Secure (unit test)
    assert 7.9 * 3600 < session["expires"] - console.clock.now < 8.1 * 3600
    assert console.tokens["admin"] not in session["value"]
    for path in PAGES.values():
        page.goto(path)
        assert console.tokens["admin"] not in page.content()
    assert not any(token in str(console.audit()) for token in console.tokens.values())
    signed = operations(console, "console_sign_in")[-1]
    assert signed["user"]["name"] == "alice" and signed["source"]["ip"] == "127.0.0.1"


@pytest.mark.parametrize("role", ["admin", "developer", "auditor"])
def test_each_role_sees_what_it_may_and_a_clear_refusal_otherwise(
    page: Page, console: Harness, role: str
) -> None:
    sign_in(page, console, role)
    nav = page.get_by_role("navigation", name="Pages")
    for title, path in PAGES.items():
        link = nav.get_by_role("link", name=title, exact=True)
        if title in ALLOWED[role]:
            expect(link).to_be_visible()
            response = page.goto(path)
            assert response is not None and response.status == 200, (role, path)
            expect(page.get_by_role("heading", level=1)).to_contain_text(title.split()[0])
        else:
            expect(link).to_have_count(0)
            response = page.goto(path)
            assert response is not None and response.status == 403
            expect(page.get_by_role("alert")).to_contain_text(
                f"needs the permission audit:read; user '{console_user(role)}' "
                f"(roles: {role}) does not have it"
            )
            refused = operations(console, "search_audit")[-1]
            assert refused["event"]["outcome"] == "failure"
            assert refused["user"]["name"] == console_user(role)
    page.goto("/")
    switch = page.get_by_role("button", name="Turn the kill switch on")
    if role == "admin":
        expect(switch).to_be_visible()
    else:
        expect(switch).to_have_count(0)
        expect(page.get_by_text("Switching needs the permission engine:control")).to_be_visible()
        # the form posted anyway (as a crafted request would be) is refused
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        answer = page.request.post(
            "/control/kill-switch/on", form={"csrf": csrf or "", "confirm": "yes"}
        )
        assert answer.status == 403
        assert "needs the permission engine:control" in answer.text()
        assert not console.engine.kill_switch_on()
    page.goto("/quota")
    submit = page.get_by_role("button", name="Submit the request")
    expect(submit).to_have_count(1 if role in ("admin", "developer") else 0)


def console_user(role: str) -> str:
    return {"admin": "alice", "developer": "dave", "auditor": "audrey"}[role]


def test_a_wrong_token_is_refused_and_audited(page: Page, console: Harness) -> None:
    page.goto("/login")
    page.get_by_label("API token").fill("not-a-token-of-anyone")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("That token is not valid")
    refused = operations(console, "authenticate")[-1]
    assert refused["event"]["outcome"] == "failure"
    assert "not-a-token-of-anyone" not in str(console.audit())


def test_admin_grants_an_approval_and_the_action_runs(page: Page, console: Harness) -> None:
    decision_id = pending_approval(console, "grant-1")
    sign_in(page, console, "admin", "/approvals")
    card = page.locator("section.approval", has_text="node=grant-1")
    expect(card).to_contain_text("On grant: reclaim via executor log on node=grant-1,uuid=GPU-")
    shot(page, "approvals")
    card.get_by_label("Reason for granting").fill("user confirmed the notebook is idle")
    card.get_by_role("button", name="Grant").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Approval granted")
    wait_for(
        lambda: any(o.ok for o in console.executed("reclaim-with-approval")), 10, "the reclaim"
    )
    console.engine.wait_idle(10)
    page.goto(f"/decisions/{decision_id}")
    expect(page.locator("#approval")).to_contain_text("granted by alice")
    expect(page.locator("#outcome")).to_contain_text("done after 1 attempt:")
    pending = console.engine.store.decision(decision_id).decision.evidence.pending_since  # type: ignore[union-attr]
    expected = when(pending) if pending is not None else "—"
    expect(page.locator("#pending-since")).to_have_text(expected)
    grafana = page.get_by_role("link", name="Grafana dashboard for this target")
    expect(grafana).to_have_attribute(
        "href", f"{GRAFANA}/d/gpuops-gpu-fleet?var-node=grant-1&var-uuid=GPU-grant-1"
    )
    kibana = page.get_by_role("link", name="Kibana search for this target")
    expect(kibana).to_have_attribute("href", re.compile(re.escape(KIBANA) + r"/app/discover#/"))
    granted = operations(console, "grant_approval")[-1]
    assert granted["user"]["name"] == "alice" and granted["user"]["roles"] == ["admin"]
    assert "user confirmed the notebook is idle" in str(granted["message"])
    page.goto("/decisions?policy=reclaim-with-approval&transition=fire")
    expect(page.locator("tbody tr").first).to_contain_text("reclaim-with-approval")


def test_admin_denies_an_approval_with_a_reason(page: Page, console: Harness) -> None:
    decision_id = pending_approval(console, "deny-1")
    sign_in(page, console, "admin", f"/decisions/{decision_id}")
    page.get_by_label("Reason for denying").fill("job is about to start")
    page.get_by_role("button", name="Deny").click()
    expect(page.get_by_role("status")).to_contain_text("Denied: nothing runs on node=deny-1")
    assert console.engine.store.approval(decision_id).status == "denied"  # type: ignore[union-attr]
    assert "job is about to start" in str(operations(console, "deny_approval")[-1]["message"])


def test_the_kill_switch_turned_on_in_the_console_stops_actions(
    page: Page, console: Harness
) -> None:
    decision_id = pending_approval(console, "kill-1")
    sign_in(page, console, "admin")
    try:
        page.get_by_role("button", name="Turn the kill switch on").click()
        # the confirmation box is required: nothing happens without it
        expect(page).to_have_url(re.compile(r"/$"))
        assert not console.engine.kill_switch_on()
        page.get_by_label("I confirm: stop every action now").check()
        page.get_by_role("button", name="Turn the kill switch on").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Kill switch on")
        assert console.engine.kill_switch_on()
        page.goto("/")
        expect(page.locator("#kill-switch-state")).to_contain_text("ON by alice")
        shot(page, "overview-kill-switch-on")
        before = len(console.executed("drain-on-gpu-fell-off-bus"))
        assert console.notify(console.alert("GPUFellOffBus", node="kill-1")).ok
        console.settle()
        assert len(console.executed("drain-on-gpu-fell-off-bus")) == before
        page.goto("/decisions?policy=drain-on-gpu-fell-off-bus&target=kill-1")
        expect(page.locator("tbody tr").first).to_contain_text("held by the kill switch")
        page.goto(f"/decisions/{decision_id}")
        page.get_by_label("Reason for granting").fill("try anyway")
        page.get_by_role("button", name="Grant").click()
        expect(page.get_by_role("alert")).to_contain_text("granted but not runnable now")
        assert console.engine.store.approval(decision_id).status == "pending"  # type: ignore[union-attr]
        page.goto("/")
        page.get_by_label("I confirm: actions may run again").check()
        page.get_by_role("button", name="Turn the kill switch off").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Kill switch off")
        assert not console.engine.kill_switch_on()
    finally:
        console.engine.set_control("kill_switch", False, "test")
    page.goto("/")
    shot(page, "overview")


def test_pausing_in_the_console_holds_actions_back_until_resumed(
    page: Page, console: Harness
) -> None:
    sign_in(page, console, "admin")
    try:
        page.get_by_label("I confirm: decisions are only recorded").check()
        page.get_by_role("button", name="Pause the engine").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Engine paused")
        page.goto("/")
        expect(page.locator("#paused-state")).to_contain_text("paused by alice")
        before = len(console.executed("drain-on-gpu-fell-off-bus"))
        assert console.notify(console.alert("GPUFellOffBus", node="pause-1")).ok
        console.settle()
        assert len(console.executed("drain-on-gpu-fell-off-bus")) == before
        page.goto("/decisions?target=pause-1&verdict=suppressed")
        expect(page.locator("tbody tr").first).to_contain_text("held: the engine is paused")
        page.goto("/decisions?target=pause-1&since=2100-01-01T00:00")
        expect(page.locator("tbody")).to_contain_text("No decision matches.")
        page.goto("/")
        page.get_by_label("I confirm: the engine acts again").check()
        page.get_by_role("button", name="Resume the engine").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Engine resumed")
        assert not console.engine.paused()
        assert operations(console, "resume_engine")[-1]["user"]["name"] == "alice"
    finally:
        console.engine.set_control("paused", False, "test")


def test_a_form_without_the_sessions_csrf_token_is_refused(page: Page, console: Harness) -> None:
    sign_in(page, console, "admin")
    for token in ("", "forged-0123456789"):
        answer = page.request.post(
            "/control/kill-switch/on", form={"csrf": token, "confirm": "yes"}
        )
        assert answer.status == 403
        assert "CSRF token is missing or wrong" in answer.text()
    assert not console.engine.kill_switch_on()
    # a real form whose hidden token was tampered with
    page.locator("form.switch input[name=csrf]").first.evaluate("e => e.value = 'tampered'")
    page.get_by_label("I confirm: stop every action now").check()
    page.get_by_role("button", name="Turn the kill switch on").click()
    expect(page.get_by_role("alert")).to_contain_text("CSRF token is missing or wrong")
    assert not console.engine.kill_switch_on()
    refused = operations(console, "set_kill_switch")[-1]
    assert refused["event"]["outcome"] == "failure" and refused["user"]["name"] == "alice"
    # the sign-in form has its own token
    login = page.request.post("/login", form={"token": console.tokens["admin"], "csrf": "x"})
    assert login.status == 403


def test_an_expired_session_goes_back_to_sign_in(page: Page, console: Harness) -> None:
    sign_in(page, console, "developer")
    expect(page.get_by_role("heading", level=1)).to_have_text("Overview")
    console.clock.advance(8 * 3600 + 1)
    page.goto("/rules")
    expect(page).to_have_url(re.compile(r"/login\?next=/rules$"))
    answer = page.request.post("/rules/validate", form={"csrf": "x", "text": "groups: []"})
    assert answer.status == 401


def test_sign_out_ends_the_session(page: Page, context: BrowserContext, console: Harness) -> None:
    sign_in(page, console, "auditor")
    cookie = next(c for c in context.cookies() if c["name"] == "gpuops_session")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    context.add_cookies([cookie])  # the old cookie, kept by someone, no longer works
    page.goto("/audit")
    expect(page).to_have_url(re.compile(r"/login\?next=/audit$"))
    assert operations(console, "console_sign_out")[-1]["user"]["name"] == "audrey"


def test_developer_asks_for_quota_and_admin_approves(
    page: Page, context: BrowserContext, console: Harness
) -> None:
    sign_in(page, console, "developer", "/quota")
    for duration in ("eight hours", "8h"):
        page.goto("/quota")
        page.get_by_label("Project").fill("vision")
        page.get_by_label("GPUs (at most").fill("16")
        page.get_by_label("For how long").fill(duration)
        page.get_by_label("Reason", exact=True).fill("paper deadline")
        page.get_by_role("button", name="Submit the request").click()
        if duration == "eight hours":
            expect(page.get_by_role("alert")).to_contain_text("duration: Value error, not a")
            assert page.url.endswith("/quota")
    expect(page.get_by_role("status")).to_contain_text("for 16 GPUs (vision) waits for an admin")
    context.clear_cookies()
    sign_in(page, console, "admin", "/quota")
    page.get_by_role("button", name="Approve the request of dave for vision").click()
    expect(page.get_by_role("status")).to_contain_text("is active")
    page.goto("/quota")
    expect(page.get_by_role("region", name="Active grants")).to_contain_text("vision: 16 GPUs")
    shot(page, "quota")
    assert operations(console, "submit_quota_request")[-1]["user"]["name"] == "dave"
    assert operations(console, "approve_quota_request")[-1]["user"]["name"] == "alice"


def test_rules_page_and_a_pasted_rule_file_validated(page: Page, console: Harness) -> None:
    sign_in(page, console, "developer", "/rules")
    expect(page.get_by_role("region", name="reclaim-with-approval")).to_contain_text("reclaim")
    expect(page.get_by_text("The rule files on disk load without errors.")).to_be_visible()
    bad = "groups:\n  - name: g\n    rules:\n      - policy: p\n        expr: up\n"
    bad += "        mode: sometimes\n"
    page.get_by_label("File name").fill("mine.yaml")
    page.get_by_label("Rule file (YAML)").fill(bad)
    page.get_by_role("button", name="Validate").click()
    expect(page.get_by_role("alert")).to_contain_text("errors")
    expect(page.locator("ul.errors")).to_contain_text("mine.yaml:")
    shot(page, "rules-validated")


def test_audit_search_and_export(page: Page, console: Harness) -> None:
    sign_in(page, console, "auditor", "/audit")
    page.get_by_label("User").fill("audrey")
    page.get_by_label("Operation type").fill("console_sign_in")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table.audit tbody tr")
    expect(rows.first).to_contain_text("console_sign_in")
    expect(rows.first).to_contain_text("127.0.0.1")
    shot(page, "audit")
    with page.expect_download() as info:
        page.get_by_role("link", name="CSV").click()
    text = info.value.path().read_text(encoding="utf-8")
    found = list(csv.DictReader(io.StringIO(text)))
    assert found and all(r["user"] == "audrey" for r in found)
    assert {r["action"] for r in found} == {"console_sign_in"}
    export = page.request.get("/audit/export.ndjson?user=audrey&action=search_audit")
    assert export.ok and all('"audrey"' in line for line in export.text().splitlines())
    assert operations(console, "search_audit_export")[-1]["user"]["name"] == "audrey"


def test_swagger_ui_and_redoc_are_served_with_local_assets(page: Page, console: Harness) -> None:
    page.goto("/api/v1/docs")
    expect(page.get_by_text("gpuops engine API").first).to_be_visible()
    expect(page.get_by_text("/api/v1/approvals/{decision_id}/grant").first).to_be_visible()
    shot(page, "api-docs", full_page=False)
    page.goto("/api/v1/redoc")
    # ReDoc renders the whole OpenAPI document in the browser before the first heading shows:
    # past expect's 5 s under a 2-core CI at load ~18 (it showed "Loading ..."). Waited for.
    heading = page.get_by_role("heading", name="Grant Approval").first
    expect(heading).to_be_visible(timeout=30_000)
    shot(page, "api-redoc", full_page=False)


UNLABELLED = """() => [...document.querySelectorAll(
    'input:not([type=hidden]), select, textarea, button, a[href]')]
  .filter(e => !((e.labels && e.labels.length) || e.getAttribute('aria-label')
                 || (e.tagName !== 'INPUT' && e.textContent.trim())))
  .map(e => e.outerHTML.slice(0, 120))"""


def test_keyboard_navigation_and_labelled_controls(page: Page, console: Harness) -> None:
    page.goto("/login")
    # focused on arrival: autofocus applies once the page has rendered, which can follow
    # goto's return on a loaded 2-core machine (it read '' there once): waited for
    expect(page.locator("#token")).to_be_focused()
    page.keyboard.type(console.tokens["admin"])
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Sign in"
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("Overview")
    decision_id = pending_approval(console, "keys-1")
    for path in [*PAGES.values(), f"/decisions/{decision_id}"]:
        page.goto(path)
        assert page.evaluate(UNLABELLED) == [], path
        assert page.locator("h1").count() == 1, path
    # the skip link comes first and moves the focus past the navigation
    page.goto("/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to main content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.goto("/")
    for _ in range(1 + list(PAGES).index("Audit") + 1):  # skip link, then the nav in order
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Audit"
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/audit$"))
