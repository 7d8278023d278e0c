"""The demo's story on its own console, as a user walks it: sign in with the token the demo
printed, find the downclock waiting for approval, grant it with a reason, see it run, then see
it on the Fleet page (held on its GPU) and on the Timeline."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from gpuops.sim.demo import Demo, DemoSettings
from tests.browser.conftest import shot
from tests.waiting import wait_for

pytestmark = pytest.mark.browser


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """The demo (its own story, no injected step: the downclock asks from the start), stopped
    when the test is done."""
    lines: list[str] = []
    settings = DemoSettings(
        duration_s=300.0,
        workdir=tmp_path / "work",
        audit_dir=tmp_path / "audit",
        timeline=(),
        api_listen="127.0.0.1:0",
    )
    runner = Demo(settings, out=lines.append)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), name="demo")
    thread.start()
    try:
        wait_for(lambda: runner.url and runner.token, 90, "the demo's console")
        yield runner
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive(), "\n".join(lines)


@pytest.fixture
def page(browser: Browser, demo: Demo) -> Iterator[Page]:
    assert demo.url is not None
    context = browser.new_context(base_url=demo.url, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(30_000)
    outside: list[str] = []

    def only_the_console(route: Route) -> None:
        if route.request.url.startswith(str(demo.url)):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_console)
    yield context.new_page()
    context.close()
    assert not outside, f"the page asked for something outside the console: {outside}"


def test_the_demo_story_on_its_console(page: Page, demo: Demo) -> None:
    page.goto("/approvals")
    page.get_by_label("API token").fill(str(demo.token))
    page.get_by_label("API token").press("Enter")
    expect(page).to_have_url(re.compile(r"/approvals$"))
    expect(page.locator("header .who")).to_contain_text("demo-admin (admin)")

    def asked() -> bool:
        page.reload()
        return page.locator("section.approval", has_text="downclock").count() == 1

    wait_for(asked, 90, "the downclock's approval on the Approvals page", interval=1.0)
    card = page.locator("section.approval", has_text="downclock")
    expect(card).to_contain_text("On grant: downclock via executor fleet on node=node-3,uuid=GPU-")
    shot(page, "demo-approval")
    card.get_by_label("Reason for granting").fill("recsys agreed to slower clocks")
    card.get_by_role("button", name="Grant").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Approval granted")

    (approval,) = demo_approvals(demo)
    page.goto(f"/decisions/{approval}")
    expect(page.locator("#approval")).to_contain_text("granted by demo-admin")

    def ran() -> bool:
        page.reload()
        return bool(re.search(r"success|done", page.locator("#outcome").inner_text(), re.I))

    wait_for(ran, 60, "the granted downclock to run", interval=1.0)
    shot(page, "demo-decision")

    # the fleet as it is now: every node up, and the downclock held on node-3 with its decision
    page.goto("/fleet")
    for name in ("node-0", "node-1", "node-2", "node-3"):
        expect(page.locator(f"#node-{name} h3 .state")).to_have_text("up")
    held = page.locator("#node-node-3").get_by_role("link", name="downclock-underused-gpus")
    expect(held).to_have_attribute("href", f"/decisions/{approval}")
    expect(page.locator("#node-node-3")).to_contain_text("downclocked")
    shot(page, "demo-fleet")

    # and over time: both charts, the decision a row and a marker linked to it
    page.goto("/timeline?range=15m")
    expect(page.locator("svg.chart")).to_have_count(2)
    expect(page.locator("#events")).to_contain_text("downclock-underused-gpus")
    expect(page.locator(f'svg.chart a[href="/decisions/{approval}"]').first).to_be_attached()
    shot(page, "demo-timeline")


def demo_approvals(demo: Demo) -> list[str]:
    """The ids of the decisions the demo said wait for an admin."""
    return sorted(demo.approvals.asked)
