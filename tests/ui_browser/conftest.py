"""Fixtures for the page tests: the app served on a free loopback port (bundled model, fp32)
and Debian's Chromium driven by Playwright (`playwright install` cannot download here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("LATENCY_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "tests"


@pytest.fixture(scope="session")
def page_server(bundled_engine):
    """The whole app (page + /lab endpoints) on the bundled model; yields its base URL."""
    from server.run import BackgroundServer
    from ui.webapp import create_app

    with BackgroundServer(create_app(bundled_engine)) as url:
        yield url


@pytest.fixture(scope="module")  # not session: sync Playwright keeps an event loop running while open
def chromium():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium):
    """A fresh tab (its own session on the page) that reports JavaScript errors as failures."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="session")
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
