"""The console pages that answer an operator's questions, in a real browser: the quota page
(projects with their quota and usage, no approving one's own request), the overview (quota
requests waiting, the audit store without Elasticsearch), the rules page ("why has it not
fired?": expression as lines, ``for``, cooldown, pending targets and when they may act) and the
audit page (reads counted, not listed; engine rows named). Screenshots: overview, quota, rules,
audit (``var/console-screenshots/``, copied into docs/console/)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from gpuops.model.decisions import Sample, freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from tests.browser.conftest import shot, sign_in
from tests.integration.api.harness import Harness


class Usage:
    """Prometheus' answer to the quota usage query: GPUs each project's jobs hold. Its
    projects are this module's own: the package's engine (shared by the browser tests, in any
    order) holds other tests' requests for other projects (vision)."""

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        held = {"audio": 12.0, "speech": 3.0}
        return tuple(Sample(freeze({"project": p}), v, 0.0) for p, v in held.items())


def ask(page: Page, project: str, gpus: str, duration: str, reason: str) -> None:
    """Submit the quota form, the project chosen from the list."""
    page.get_by_label("Project").select_option(project)
    page.get_by_label("GPUs (at most").fill(gpus)
    page.get_by_label("For how long").fill(duration)
    page.get_by_label("Reason", exact=True).fill(reason)
    page.get_by_role("button", name="Submit the request").click()


def test_quota_lists_projects_and_an_admin_does_not_approve_their_own_request(
    page: Page, context: BrowserContext, console: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    quota = console.engine.quota
    projects = {"audio": 8, "speech": 4, "robotics": 16}
    monkeypatch.setattr(quota, "settings", quota.settings.model_copy(update={"projects": projects}))
    monkeypatch.setattr(console.engine, "prometheus", Usage())
    sign_in(page, console, "developer", "/quota")
    ask(page, "speech", "4", "8h", "ASR retraining")
    expect(page.get_by_role("status")).to_contain_text("for 4 GPUs (speech) waits for an admin")
    context.clear_cookies()
    sign_in(page, console, "admin", "/quota")
    ask(page, "robotics", "8", "4h", "sim-to-real runs")
    page.goto("/")
    waiting = page.get_by_role("region", name="Quota requests waiting for an admin")
    expect(waiting).to_contain_text("speech: 4 GPUs for 8.0 h, asked by dave")
    expect(waiting).to_contain_text("robotics: 8 GPUs for 4.0 h, asked by alice")
    audit = page.get_by_role("region", name="Audit shipping")
    expect(audit).to_contain_text("in the local spool (kept there: nothing ships them)")
    expect(audit).not_to_contain_text("not yet shipped")
    shot(page, "overview")
    page.goto("/quota")
    expect(page.get_by_role("button", name="Approve the request of alice")).to_have_count(0)
    expect(page.get_by_text("your own request: another admin approves it")).to_be_visible()
    [own] = [r for r in quota.requests() if r.requested_by == "alice" and r.status == "pending"]
    refused = page.request.post(f"/quota/{own.id}/approve", form={"csrf": _csrf(page)})
    assert refused.status == 409 and "another admin approves it" in refused.text()
    page.get_by_role("button", name="Approve the request of dave for speech").click()
    expect(page.get_by_role("status")).to_contain_text("is active")
    page.goto("/quota")
    table = page.locator("#projects")
    expect(table.get_by_role("row", name=re.compile("^speech"))).to_contain_text(
        "4 GPUs 4 GPUs 8 GPUs 3 GPUs 0"
    )
    expect(table.get_by_role("row", name=re.compile("^audio"))).to_contain_text(
        "8 GPUs 0 GPUs 8 GPUs 12 GPUs over quota 0"
    )
    expect(table.get_by_role("row", name=re.compile("^robotics"))).to_contain_text(
        "16 GPUs 0 GPUs 16 GPUs 0 GPUs 1"
    )
    shot(page, "quota")


def _csrf(page: Page) -> str:
    found = page.locator('input[name="csrf"]').first.get_attribute("value")
    assert found
    return found


RULE = """\
groups:
  - name: reclaim
    rules:
      - policy: reclaim-idle-gpus
        expr: |
          avg_over_time(DCGM_FI_DEV_GPU_UTIL[30m]) < 5
            and on (node, uuid) gpuops_gpu_allocated == 1
        for: 10m
        cooldown: 1h
        limits: {max_per_hour: 4}
        target: [node, uuid]
        action: {type: reclaim, executor: log}
"""


def test_the_rules_page_says_why_a_policy_has_not_acted(page: Page, console: Harness) -> None:
    extra = console.tmp / "rules" / "reclaim.yaml"
    extra.write_text(RULE)
    assert console.engine.reload().ok
    try:
        now = console.clock()
        labels = {"node": "node-3", "uuid": "GPU-7"}
        idle = TargetState(Status.PENDING, now - 240, now, 1.5, freeze(labels))
        with console.engine.store.transaction() as db:  # what an evaluation leaves
            console.engine.store.save_policy_state(
                db, "reclaim-idle-gpus", PolicyState(freeze({"node=node-3,uuid=GPU-7": idle}))
            )
        sign_in(page, console, "developer", "/rules")
        policy = page.get_by_role("region", name="reclaim-idle-gpus")
        expect(policy.get_by_text("reclaim.yaml:4")).to_be_visible()
        expr = policy.locator("pre.expr")
        expect(expr).to_have_text(
            "avg_over_time(DCGM_FI_DEV_GPU_UTIL[30m]) < 5\n"
            "  and on (node, uuid) gpuops_gpu_allocated == 1\n"
        )
        expect(policy).not_to_contain_text("\\n")
        expect(policy).to_contain_text("For10m")
        expect(policy).to_contain_text("Cooldown1h")
        expect(policy).to_contain_text("at most 4 actions an hour")
        row = policy.locator("table.targets tbody tr")
        expect(row).to_contain_text("node=node-3,uuid=GPU-7")
        expect(row).to_contain_text("pending")
        expect(row).to_contain_text("(in 6m)")
        expect(row).to_contain_text("for 10m")
        expect(page.locator("main")).not_to_contain_text(str(console.tmp))
        shot(page, "rules")
    finally:
        extra.unlink()
        assert console.engine.reload().ok


def test_the_audit_counts_page_reads_and_names_the_engine_s_rows(
    page: Page, console: Harness
) -> None:
    assert console.notify(console.alert("GPUFellOffBus", node="audit-1")).ok
    console.settle()
    sign_in(page, console, "auditor", "/decisions")
    for path in ("/", "/decisions", "/rules"):
        page.goto(path)
    page.goto("/audit?since=1h")
    reads = page.locator("#reads")
    expect(reads.get_by_role("row", name=re.compile("audrey console list_rules"))).to_be_visible()
    actions = {str(d["event"]["action"]) for d in console.operations()}
    assert "console_sign_in" in actions and "list_rules" not in actions
    page.get_by_label("Stream").select_option("decision")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table.audit tbody tr").filter(has_text="node=audit-1")
    expect(rows.first).to_contain_text("engine (policy drain-on-gpu-fell-off-bus)")
    page.goto("/audit?since=1h")
    shot(page, "audit")
