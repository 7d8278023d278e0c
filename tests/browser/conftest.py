"""Browser tests of the web console: Debian's headless chromium (``/usr/bin/chromium``, which
``make test`` installs) driven by Playwright — no browser download.

One engine with its API (``tests.integration.api.harness``) and one browser for the whole session;
each test gets a fresh browser context (its own cookies). Every request the page makes to
anything but the console is aborted, so a page that needs the internet fails. Screenshots go
to ``var/console-screenshots/`` (git-ignored); the chosen ones are copied into docs/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, sync_playwright

from gpuops.settings import ConsoleSettings
from tests.integration.api.harness import Harness, running_api

GRAFANA = "http://grafana.example:3000"
KIBANA = "http://kibana.example:5601"
CHROMIUM = os.environ.get("GPUOPS_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "var" / "console-screenshots"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="package")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """The engine and its API + console, shared by the browser tests."""
    links = ConsoleSettings(grafana_url=GRAFANA, kibana_url=KIBANA)
    with running_api(tmp_path_factory.mktemp("console"), api={"console": links}) as harness:
        yield harness


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Browser, console: Harness) -> Iterator[BrowserContext]:
    ctx = browser.new_context(
        base_url=console.url, viewport={"width": 1280, "height": 860}, accept_downloads=True
    )
    # a deadline for each wait on the page, not a wait: a loaded machine (the suite runs in
    # worker processes) took over 10 s for one navigation
    ctx.set_default_timeout(30_000)
    outside: list[str] = []

    def only_the_console(route: Route) -> None:
        if route.request.url.startswith(console.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    ctx.route("**/*", only_the_console)
    yield ctx
    ctx.close()
    assert not outside, f"the page asked for something outside the console: {outside}"


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def sign_in(page: Page, console: Harness, role: str, path: str = "/") -> None:
    """Sign in on the sign-in page (keyboard only) as the user of ``role``."""
    page.goto(path)
    page.get_by_label("API token").fill(console.tokens[role])
    page.get_by_label("API token").press("Enter")
    page.wait_for_url(re.compile(r"^(?!.*/login)"))


def shot(page: Page, name: str, full_page: bool = True) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
