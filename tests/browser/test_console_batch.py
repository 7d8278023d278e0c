"""The batch operations pages in a real browser: the list (state, waves, nodes by state, the
failed node and why, who started it), one operation (each node in words, its steps linked to
the decision page), and the buttons: none for an auditor, approve, retry a failed node,
resume and cancel (confirmed) for an admin, each through the API route behind it. Screenshot
``batch.png`` (``var/console-screenshots/``)."""

from __future__ import annotations

import re

from playwright.sync_api import BrowserContext, Page, expect

from gpuops.model.batch.operation import FleetNode
from gpuops.model.batch.opfile import parse_operation
from tests.browser.conftest import shot, sign_in
from tests.integration.api.harness import Harness

OPERATION = """\
operation: firmware
targets: {nodes: [bt-1, bt-2, bt-3]}
quarantine: none
step:
  command:
    - sh
    - -c
    - 'test "$1" != bt-2 || { echo "checksum mismatch on $1" >&2; exit 4; }'
    - step
    - '{{ $labels.node }}'
max_parallel: 2
max_unavailable: 2
failure_threshold: 2
enforce: true
"""
WAITING = """\
operation: reboot
targets: {nodes: [bt-4]}
quarantine: none
step: {command: ["true"]}
approval: true
"""


class Fleet:
    def nodes(self) -> list[FleetNode]:
        return [FleetNode(f"bt-{i}", pool="p", gpus=8) for i in range(1, 5)]


def test_batch_pages_tell_the_nodes_and_only_an_admin_acts(
    page: Page, context: BrowserContext, console: Harness
) -> None:
    runner = console.engine.batches
    batch = runner.start(
        parse_operation(OPERATION, "fw.yaml"), OPERATION, Fleet(), None, by="carol"
    )
    runner.run(batch, Fleet())
    waiting = runner.start(parse_operation(WAITING, "rb.yaml"), WAITING, Fleet(), None, by="bob")

    sign_in(page, console, "auditor")
    page.get_by_role("link", name="Batch", exact=True).click()
    row = page.get_by_role("row", name=re.compile(f"^{batch}"))
    expect(row).to_contain_text("by carol")
    expect(row).to_contain_text("2 done, 1 failed")
    expect(row).to_contain_text("bt-2 failed at step: command 'sh' exited 4")
    expect(row).to_contain_text("checksum mismatch on bt-2; left in service")
    expect(page.get_by_role("row", name=re.compile(f"^{waiting}"))).to_contain_text(
        "waits for an approval"
    )
    row.get_by_role("link", name=batch).click()
    expect(page.locator("#batch-summary")).to_have_text("done in 2 waves: 2 done, 1 failed.")
    expect(page.locator("#node-bt-1")).to_contain_text("bt-1 done in wave 0: step")
    acting = page.get_by_role("button", name=re.compile("Approve|Retry|Resume|Cancel"))
    expect(acting).to_have_count(0)  # the auditor only looks
    page.locator("#node-bt-1").get_by_role("link", name="step").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Decision")
    expect(page.locator("main")).to_contain_text(f"policy batch/{batch} decided")

    context.clear_cookies()
    sign_in(page, console, "admin", f"/batch/{waiting}")
    page.get_by_role("button", name="Approve the operation").click()
    expect(page.get_by_role("status")).to_contain_text(f"{waiting} approved by alice")
    page.goto(f"/batch/{batch}")
    shot(page, "batch")
    page.get_by_role("button", name="Retry bt-2").click()
    expect(page.get_by_role("status")).to_contain_text(f"bt-2 is back in the queue of {batch}")
    page.goto(f"/batch/{batch}")
    expect(page.locator("#batch-summary")).to_contain_text("paused (bt-2 to retry)")
    expect(page.locator("#node-bt-2")).to_contain_text("bt-2 waits for its wave")
    page.get_by_role("button", name="Resume the operation").click()
    expect(page.get_by_role("status")).to_contain_text("the engine goes on from where it stopped")
    page.goto(f"/batch/{batch}")
    page.get_by_label("I confirm: no node starts again").check()
    page.get_by_role("button", name="Cancel the operation").click()
    expect(page.get_by_role("status")).to_contain_text(f"{batch} is cancelled")
    assert runner.record(batch).status == "cancelled"
    assert runner.nodes(batch)["bt-2"].status == "cancelled"
