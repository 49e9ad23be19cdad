"""With --api-key, a browser is sent to the login form, and once logged in the page works as
without a key: its session, its token stream and its timings all pass the key check (cookie).
Uses the paced test source (no model)."""

import pytest

from server.api import create_api
from server.run import BackgroundServer
from ui.chat.paced import PacedSource
from ui.webapp import create_app

KEY = "page-key"
REPLY_DONE = "#lab-log-chat .lab-msg.assistant:last-child .lab-stats span"


@pytest.fixture(scope="module")
def keyed_server():
    source = PacedSource(tokens_per_s=400, prefill_ms=5)
    api = create_api({"paced": source}, api_key=KEY)
    with BackgroundServer(create_app(api.state.backends, app=api)) as url:
        yield url
    source.close()


def test_the_page_asks_for_the_key_then_streams_as_usual(keyed_server, browser_page):
    page = browser_page
    page.goto(keyed_server)
    assert "/login" in page.url
    page.fill("input[name=key]", "wrong")
    page.click("button[type=submit]")
    assert "not right" in page.content()
    page.fill("input[name=key]", KEY)
    page.click("button[type=submit]")
    page.wait_for_selector("#lab-send")
    page.wait_for_function("() => window.lab && window.lab.session")
    page.fill("#lab-msg textarea", "Hello there")
    page.click("#lab-send")
    page.wait_for_selector(REPLY_DONE, timeout=60_000)
    run = page.evaluate("() => { const r = window.lab.panes.chat.runs.at(-1); return {error: r.error, row: r.row}; }")
    assert run["error"] is None and run["row"]["output_tokens"] > 0
