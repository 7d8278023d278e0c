"""The GPU health page in a real browser: the nodes on the remediation ladder by stage, each in
words with its fault, time in the stage and the quarantine that put it there; the clear button
of a node that needs a human for an operator with engine:control only, through the API route
behind it. Screenshot ``health.png`` (``var/console-screenshots/``)."""

from __future__ import annotations

import json
import time

from playwright.sync_api import BrowserContext, Page, expect

from gpuops.model.health.ladder import Repair, Stage
from tests.browser.conftest import shot, sign_in
from tests.integration.api.harness import Harness


def put(console: Harness, repair: Repair) -> None:
    """A node's record as the ladder stores it."""
    data = json.dumps(repair.as_dict())
    console.engine.store.save_repair(repair.node, repair.stage.value, data, repair.since)


def test_the_health_page_lists_nodes_by_stage_and_only_an_operator_clears(
    page: Page, context: BrowserContext, console: Harness
) -> None:
    now = time.time()
    put(
        console,
        Repair(
            node="hn-7",
            stage=Stage.NEEDS_HUMAN,
            since=now - 7200,
            gpu="GPU-7",
            reason="XID 79 (GPU has fallen off the bus) x1",
            quarantined_by="a" * 24,
            done=("reset_gpu", "reboot"),
            why="the health check failed after reset_gpu, reboot",
        ),
    )
    put(
        console,
        Repair(
            node="hn-2",
            stage=Stage.REMEDIATING,
            since=now - 90,
            gpu="GPU-2",
            reason="XID 48 (double-bit ECC error) x1",
            quarantined_by="b" * 24,
            step="reboot",
            done=("reset_gpu",),
        ),
    )

    sign_in(page, console, "auditor")
    page.get_by_role("link", name="Health", exact=True).click()
    expect(page.locator("#health-counts")).to_have_text("1 node needs a human, 1 node remediating.")
    human = page.locator("#stage-needs_human #node-hn-7")
    expect(human).to_contain_text("XID 79 (GPU has fallen off the bus) x1")
    expect(human).to_contain_text("2h")
    expect(human).to_contain_text(
        "hn-7 needs a human: the health check failed after reset_gpu, reboot; done: reset_gpu,"
        " reboot; it stays drained until an admin acts"
    )
    expect(human.get_by_role("link", name="its quarantine")).to_have_attribute(
        "href", "/decisions/" + "a" * 24
    )
    expect(page.locator("#stage-remediating #node-hn-2")).to_contain_text(
        "hn-2 is being remediated: reboot; done: reset_gpu"
    )
    expect(page.get_by_role("button", name="Clear hn-7")).to_have_count(0)
    expect(human).to_contain_text("clearing needs the permission engine:control")

    context.clear_cookies()
    sign_in(page, console, "admin", "/health")
    shot(page, "health")
    page.get_by_role("button", name="Clear hn-7").click()
    expect(page.get_by_role("status")).to_contain_text("hn-7 is cleared")
    cleared = console.engine.ladder.repair("hn-7")
    assert cleared is not None and cleared.stage is Stage.HEALTHY
    page.goto("/health")
    expect(page.locator("#stage-healthy #node-hn-7")).to_contain_text("hn-7 is off the ladder")
