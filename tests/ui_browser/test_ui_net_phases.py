"""A remote reply's network phases on the page: over HTTPS to a local server with a certificate the test
makes, the first reply's waterfall shows DNS, connect and TLS as sub-stages of network in; the next
reply rides the kept-alive connection and shows none of them, saying so."""

import contextlib
import time

from test_remote_network import certificate, engine_for, https_port  # noqa: F401 - fixtures

from server.run import BackgroundServer

LAST = "#lab-log-chat .lab-msg.assistant:last-child"


def send(page, text, n):
    page.fill("#lab-msg textarea", text)
    page.click("#lab-send")
    page.wait_for_function(f"() => window.lab.panes.chat.runs.length === {n} && window.lab.panes.chat.runs.at(-1).client")


def rows(page):
    return page.locator("#lab-ov-chat .lab-card:nth-child(2) text.lab-rowlabel").evaluate_all(
        "els => els.map(e => e.lastChild.textContent)")  # the label after its <title>


def test_a_new_connection_shows_its_phases_and_a_reused_one_none(https_port, certificate, browser_page,  # noqa: F811
                                                                  artifacts):
    from ui.webapp import create_app

    with contextlib.ExitStack() as stack:
        remote = engine_for(f"https://localhost:{https_port}", certificate)
        stack.callback(remote.close)
        url = stack.enter_context(BackgroundServer(create_app({"remote": remote})))
        page = browser_page
        page.goto(url)
        page.wait_for_function("() => window.lab && window.lab.session && window.lab.clock.offset !== null")
        # the app asked the remote about its model at start; uvicorn drops an idle connection after 5 s, so
        # the first reply opens a new one
        time.sleep(6)
        send(page, "hi", 1)
        first = rows(page)
        for label in ("network in", "· DNS", "· connect", "· TLS handshake", "· request sent", "· response headers"):
            assert any(label in r for r in first), (label, first)
        assert not any("connection reused" in r for r in first)
        page.screenshot(path=str(artifacts / "page-net-phases.png"), full_page=True)
        send(page, "again", 2)
        again = rows(page)
        assert any("· request sent" in r for r in again) and any("· connection reused" in r for r in again)
        assert not {"· DNS", "· connect", "· TLS handshake"} & set(again)
        assert "kept-alive connection" in page.locator("#lab-ov-chat .lab-card:nth-child(2) svg").evaluate("e => e.textContent")
