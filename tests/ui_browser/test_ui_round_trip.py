"""A chat turn crosses the wire once after its stream: the browser's timings go up and the reply's row
(and the open table's rows) come back in one request, POST /lab/turn; no table fetch, no clock pings,
no other request follows the stream. Counted from the browser's own Resource Timing entries."""

from .test_ui_page import open_page, set_number, wait_runs

# Every request the page made after the stream of its first /lab/chat had ended (its body read to the end).
AFTER_THE_STREAM = """() => {
    const entries = performance.getEntriesByType("resource");
    const chat = entries.find((e) => new URL(e.name).pathname === "/lab/chat");
    if (!chat) return null;
    return entries.filter((e) => e !== chat && e.startTime >= chat.responseEnd).map((e) => new URL(e.name).pathname);
}"""


def test_a_chat_turn_makes_one_request_after_its_stream(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    page.evaluate("() => performance.setResourceTimingBufferSize(100000)")  # Gradio's own files fill the default
    set_number(page, "lab-chat-max", 8)
    page.click("text=Replies in this tab")  # the table open: its rows come back with the turn
    page.wait_for_selector("#lab-table-chat .lab-table-wrap")
    sent = []
    page.on("request", lambda r: sent.append((r.method, r.url.removeprefix(page_server))))
    page.fill("#lab-msg textarea", "Say hello in five words.")
    page.click("#lab-send")
    wait_runs(page, "chat", 1)
    page.wait_for_timeout(2_000)  # anything the page would still send after the turn
    assert page.evaluate(AFTER_THE_STREAM) == ["/lab/turn"]
    assert sent == [("POST", "/lab/chat"), ("POST", "/lab/turn")], sent  # and the stream itself: one request
    # what came back with it: the row and stats line under the reply, the table (no fetch of its own)
    run = page.evaluate("() => { const r = window.lab.panes.chat.runs[0]; return {row: r.row, error: r.error}; }")
    assert run["error"] is None and run["row"]["client_ttft_ms"] is not None
    assert page.locator("#lab-table-chat table tbody tr").count() == 1
    assert page.locator("#lab-log-chat .lab-msg.assistant .lab-stats span").count() > 0
