"""The page in a real browser (headless Chromium) on the bundled model: chat streaming with live
overlays, browser vs server TTFT, stop, the Gradio transport, and one A/B pair with its delta table.
Screenshots go to artifacts/tests/ (gitignored)."""

import re

REPLY_DONE = "#lab-log-{pane} .lab-msg.assistant:last-child .lab-stats span"


def open_page(page, url):
    page.goto(url)
    page.wait_for_selector("#lab-send")
    page.wait_for_function("() => window.lab && window.lab.session")


def set_number(page, elem_id, value):
    """Type into a Gradio slider's number box and wait until the slider itself holds the value (its range
    input mirrors the component's state). Typing into a box that Gradio is still mounting (an accordion
    just opened) can be lost, so it types again rather than sending a request with the old value."""
    box = page.locator(f"#{elem_id} input[type=number]")
    held = f"() => document.querySelector('#{elem_id} input[type=range]').value === {str(value)!r}"
    for _ in range(5):
        box.fill(str(value))
        box.press("Tab")
        try:
            page.wait_for_function(held, timeout=2_000)
            return
        except Exception:
            continue
    raise AssertionError(f"the slider {elem_id} never took the value {value}")


def last_run(page, pane):
    return page.evaluate(f"""() => {{
        const r = window.lab.panes[{pane!r}].runs.at(-1);
        return {{error: r.error, row: r.row, reply: r.record && r.record.reply, text: r.view.text.data,
                 client: r.client, sent: r.settings}};
    }}""")


def overlay_ttfts(page, pane):
    """The two 'TTFT x ms' labels of the TTFT-vs-total overlay, as numbers (server, browser)."""
    text = page.inner_text(f"#lab-ov-{pane} .lab-card:first-child")
    found = [float(v.replace(",", "")) for v in re.findall(r"TTFT ([\d,.]+) ms", text)]
    assert len(found) == 2, text
    return found


def test_chat_streams_and_the_overlays_show_server_and_browser_ttft(page_server, browser_page, artifacts):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 12)
    set_number(page, "lab-chat-temperature", 0)
    page.fill("#lab-msg textarea", "What is the capital of France?")
    page.press("#lab-msg textarea", "Enter")  # Enter sends
    page.wait_for_function("() => document.querySelector('#lab-msg textarea').value === ''")  # the box clears
    page.wait_for_selector(REPLY_DONE.format(pane="chat"), timeout=60_000)
    run = last_run(page, "chat")
    assert run["error"] is None and run["text"] == run["reply"] and run["reply"]  # painted = generated
    row = run["row"]
    assert row["output_tokens"] <= 12 and row["client_ttft_ms"] is not None
    assert row["client_ttft_ms"] >= row["ttft_ms"]  # the browser cannot see a token before it exists
    assert row["transport_overhead_ms"] == row["client_ttft_ms"] - row["ttft_ms"]
    server, browser = overlay_ttfts(page, "chat")
    assert browser >= server > 0
    assert abs(server - row["ttft_ms"]) <= 1 and abs(browser - row["client_ttft_ms"]) <= 1
    stats = page.inner_text("#lab-log-chat .lab-msg.assistant:last-child .lab-stats")
    assert "TTFT" in stats and "seen" in stats and "tok/s" in stats
    assert page.inner_text("#lab-log-chat .lab-msg.assistant:last-child .lab-what").startswith("First token after")
    for title in ("TTFT vs total", "Where the time went", "Token timeline", "Optimization effects"):
        assert page.locator(f"#lab-ov-chat h4:has-text('{title}')").count() == 1
    assert page.locator("#lab-ov-chat svg path").count() >= 3  # server emit, arrival, paint lines
    page.screenshot(path=str(artifacts / "page-chat.png"), full_page=True)

    # a second turn: multi-turn on the server, and the conversation table fills
    page.fill("#lab-msg textarea", "And of Italy?")
    page.click("#lab-send")
    try:
        page.wait_for_function("() => window.lab.panes.chat.runs.length === 2 && window.lab.panes.chat.runs[1].row"
                               " && window.lab.panes.chat.runs[1].client")
    except Exception:
        print(page.evaluate("() => JSON.stringify(window.lab.panes.chat.runs.map(r => [r.requestId, r.error, !!r.row, !!r.client, r.finished, r.view.text.data, r.view.status.textContent]))"))
        raise
    assert last_run(page, "chat")["row"]["turn"] == 2
    page.click("text=Replies in this tab")
    page.wait_for_function("() => document.querySelectorAll('#lab-table-chat tbody tr').length === 2")
    href = page.get_attribute("#lab-table-chat a.lab-export[data-fmt=csv]", "href")
    assert href.startswith("/lab/export/") and href.endswith(".csv?pane=chat")


def test_stop_cancels_the_generation_on_the_server(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 400)
    page.fill("#lab-msg textarea", "Write a very long story about a dragon.")
    page.click("#lab-send")
    page.wait_for_function("() => window.lab.panes.chat.runs[0].rec.arrival.length >= 2")
    page.click("#lab-stop")
    page.wait_for_function("() => window.lab.panes.chat.runs[0].client", timeout=60_000)
    row = last_run(page, "chat")["row"]
    assert row["finish_reason"] == "cancelled" and row["output_tokens"] < 400


def test_the_gradio_transport_streams_the_same_reply(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 6)
    page.click("#lab-transport label:has-text('Gradio')")
    page.fill("#lab-msg textarea", "Say hello.")
    page.click("#lab-send")
    page.wait_for_selector(REPLY_DONE.format(pane="chat"), timeout=60_000)
    run = last_run(page, "chat")
    assert run["error"] is None and run["text"] == run["reply"]
    assert run["client"]["transport"] == "gradio" and run["row"]["client_ttft_ms"] >= run["row"]["ttft_ms"]


def open_ab(page, url, max_tokens):
    """The page's A/B tab, both panes' settings open and set to at most `max_tokens`: each slider checked
    again once both are set, since a value typed while Gradio mounts the other accordion was once lost
    after its own check (pane A's request left without it)."""
    open_page(page, url)
    page.click("button[role=tab]:has-text('A/B')")
    for side in ("A", "B"):
        page.click(f"text={side} settings")
        set_number(page, f"lab-{side}-max", max_tokens)
    page.wait_for_timeout(300)
    for side in ("A", "B"):
        set_number(page, f"lab-{side}-max", max_tokens)


def run_ab(page, message, timeout=90_000):
    """Send `message` through pane A, then B, and wait for the delta table."""
    page.fill("#lab-ab-msg textarea", message)
    page.click("#lab-ab-run")
    page.wait_for_selector("#lab-delta table", timeout=timeout)


def test_an_ab_pair_streams_both_panes_and_fills_the_delta_table(page_server, browser_page, artifacts):
    page = browser_page
    open_ab(page, page_server, 8)
    run_ab(page, "Name a color.")
    for side in ("A", "B"):
        run = last_run(page, side)
        assert run["error"] is None and run["row"]["client_ttft_ms"] >= run["row"]["ttft_ms"]
        assert page.locator(f"#lab-ov-{side} .lab-card").count() == 4
        assert run["sent"]["max_new_tokens"] == 8, (side, run["sent"])  # each side sent its own settings
        assert run["row"]["output_tokens"] <= 8, (side, run["row"])  # and the engine kept to them
    a, b = last_run(page, "A")["reply"], last_run(page, "B")["reply"]
    assert a == b  # same greedy config, same prompt: same text
    delta = page.inner_text("#lab-delta")
    assert "The two replies are identical." in delta
    for label in ("TTFT (server)", "TTFT (browser)", "TPOT", "total (server)", "decode speed", "winner"):
        assert label in delta
    assert page.locator("#lab-delta td.lab-winner").count() >= 5
    # both panes' overlays use one time scale: the same right-most tick label
    ticks = [page.locator(f"#lab-ov-{s} .lab-card:first-child text.lab-tick").last.text_content() for s in "AB"]
    assert ticks[0] == ticks[1]
    page.screenshot(path=str(artifacts / "page-ab.png"), full_page=True)


def wait_runs(page, pane, n, timeout=60_000):
    page.wait_for_function(f"() => window.lab.panes[{pane!r}] && window.lab.panes[{pane!r}].runs.length === {n}"
                           f" && window.lab.panes[{pane!r}].runs[{n - 1}].client", timeout=timeout)


def test_regenerate_and_clear(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 5)
    page.fill("#lab-msg textarea", "Say a word.")
    page.click("#lab-send")
    wait_runs(page, "chat", 1)
    page.click("#lab-regen")
    wait_runs(page, "chat", 2)
    assert last_run(page, "chat")["row"]["turn"] == 1  # the same turn, answered again
    page.wait_for_function("() => document.querySelectorAll('#lab-log-chat .lab-msg.assistant').length === 1")
    assert page.locator("#lab-log-chat .lab-msg.user").count() == 1
    page.click("#lab-clear")
    page.wait_for_selector("#lab-log-chat .lab-empty")
    page.fill("#lab-msg textarea", "Start over.")
    page.click("#lab-send")
    wait_runs(page, "chat", 3)
    assert last_run(page, "chat")["row"]["turn"] == 1  # the server forgot the conversation too


def test_two_tabs_contend_and_the_second_shows_its_queue_time(page_server, chromium):
    tabs = [chromium.new_page(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    try:
        for tab in tabs:
            open_page(tab, page_server)
            set_number(tab, "lab-chat-max", 40)
        tabs[0].fill("#lab-msg textarea", "Count from one to twenty in words.")
        tabs[0].click("#lab-send")
        tabs[0].wait_for_function("() => window.lab.panes.chat.runs[0].rec.arrival.length >= 1")
        tabs[1].fill("#lab-msg textarea", "Say hi.")
        tabs[1].click("#lab-send")
        tabs[1].wait_for_function("() => /queued: 1 request ahead/.test(document.querySelector("
                                  "'#lab-log-chat .lab-status').textContent)", timeout=30_000)
        for tab in tabs:
            wait_runs(tab, "chat", 1, timeout=120_000)
        first, second = last_run(tabs[0], "chat")["row"], last_run(tabs[1], "chat")["row"]
        assert first["queue_position"] == 0 and second["queue_position"] == 1
        # the second waited for the rest of the first reply (max batch 1). How long depends on when the
        # second tab's request arrived; the first may itself have waited for the worker's idle
        # measurements, so the two queue times are not compared with each other.
        assert second["queue_ms"] > 10, (first, second)
        # the waterfall's queue bar carries that wait, in ms
        title = tabs[1].locator("#lab-ov-chat .lab-card:nth-child(2) rect title").all_text_contents()
        queue = [t for t in title if t.startswith("queue")]
        assert queue and float(queue[0].rsplit(": ", 1)[1].split(" ")[0].replace(",", "")) > 10
    finally:
        for tab in tabs:
            tab.close()


LONG_PROMPT = ("Here are my notes from the planning meeting. The library will open three branches, one per district, "
               "each with a reading room, a children's corner and a repair cafe on Saturdays. ") * 22 + \
              "Summarize the plan in one sentence."


def test_feedback_comes_before_the_first_token_and_a_long_prompt_shows_prefill_progress(page_server, browser_page,
                                                                                          artifacts):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 4)
    assert not page.locator("#lab-chat-chunked-prefill input").is_checked()  # off by default: it costs prefill time
    page.check("#lab-chat-chunked-prefill input")
    page.fill("#lab-msg textarea", LONG_PROMPT)
    page.click("#lab-send")
    page.wait_for_selector("#lab-log-chat .lab-msg.user")  # the message is echoed at once
    page.wait_for_selector("#lab-log-chat .lab-progress", timeout=60_000)  # a progress bar, not a frozen wait
    page.screenshot(path=str(artifacts / "page-prefill-progress.png"))
    wait_runs(page, "chat", 1, timeout=120_000)
    r = page.evaluate("""() => { const r = window.lab.panes.chat.runs[0];
        return {progress: r.progress, arrival: r.rec.arrival, client: r.client, row: r.row, text: r.view.text.data,
                reply: r.record.reply, perceived: r.view.el.querySelector('.lab-perceived').innerText}; }""")
    row, progress = r["row"], r["progress"]
    assert r["text"] == r["reply"]
    total = row["prefill_tokens"]
    assert total > 512  # three chunks of 256 or more
    done = [d for _, d, _ in progress]
    assert done == sorted(done) and done[0] == 0 and done[-1] == total and len(set(done)) >= 4
    assert all(t == total for _, _, t in progress)
    first_arrival = r["arrival"][0]
    assert all(t <= first_arrival for t, _, _ in progress)  # all progress before the first token
    # feedback (the message and a status) painted before the server's first status, which came before any token
    assert row["client_feedback_ms"] is not None and row["client_status_ms"] is not None
    assert row["client_feedback_ms"] <= row["client_status_ms"] <= first_arrival <= row["client_ttft_ms"]
    assert row["client_first_word_ms"] >= row["client_ttft_ms"]
    assert "feedback" in r["perceived"] and "first word" in r["perceived"]


def test_adaptive_smoothing_paints_the_whole_reply_and_reports_its_hold(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 24)
    set_number(page, "lab-chat-temperature", 0)
    page.click("#lab-chat-smoothing input")
    page.click("li:has-text('adaptive')")
    page.fill("#lab-msg textarea", "Name three rivers in Europe.")
    page.click("#lab-send")
    wait_runs(page, "chat", 1, timeout=120_000)
    r = page.evaluate("""() => { const r = window.lab.panes.chat.runs[0];
        return {row: r.row, text: r.view.text.data, reply: r.record.reply, client: r.client,
                perceived: r.view.el.querySelector('.lab-perceived').innerText}; }""")
    assert r["text"] == r["reply"] and r["reply"]  # nothing dropped, nothing reordered
    row, client = r["row"], r["client"]
    assert row["smoothing"] == "adaptive/word" and "smooth adaptive · by word" in row["config"]
    assert row["smoothing_hold_ms"] is not None and row["smoothing_hold_ms"] >= 0
    assert client["shown_chars"][-1] == len(r["reply"]) and client["shown_chars"] == sorted(client["shown_chars"])
    assert all(p is not None and p >= t for t, p in zip(client["shown_ms"], client["shown_paint_ms"]))
    assert "smoothing (adaptive/word) held" in r["perceived"]
