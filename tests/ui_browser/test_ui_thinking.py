"""Thinking vs answering on the page: a scripted thinking reply (the paced source with think=True, as
`python app.py --paced-source 40 --paced-think` serves it) shows its thought folded away under a live
"thinking… N tokens", a thought band in the overlays, and an answer TTFT of its own, the server's and
the browser's, the browser's measured live by the page and again by the server from the same paint log."""

import pytest
from support import paced_app


LAST = "#lab-log-chat .lab-msg.assistant:last-child"
DONE = LAST + " .lab-stats span"


@pytest.fixture(scope="module")
def thinking_app():
    with paced_app(40, think=True) as url:  # 16 tokens of thought at 40 tok/s: ~0.4 s of thinking
        yield url


def test_a_thinking_reply_shows_a_thought_band_and_its_own_answer_ttft(thinking_app, browser_page, artifacts):
    page = browser_page
    page.goto(thinking_app)
    page.wait_for_selector("#lab-send")
    page.wait_for_function("() => window.lab && window.lab.session && window.lab.clock.offset !== null")
    page.fill("#lab-msg textarea", "Think first, then answer.")
    page.click("#lab-send")
    # while it thinks: the fold says so, live, with a growing token count
    page.wait_for_selector(LAST + " details.lab-thought.lab-thinking summary", timeout=30_000)
    live = page.inner_text(LAST + " details.lab-thought summary")
    assert live.startswith("thinking… ") and live.endswith("tokens")
    page.wait_for_selector(DONE, timeout=60_000)
    page.wait_for_function("() => window.lab.panes.chat.runs.at(-1).client")
    run = page.evaluate("""() => { const r = window.lab.panes.chat.runs.at(-1);
        return {row: r.row, client: r.client, live: r.rec.toClient(r.transport), answer: r.view.text.data,
                thought: r.view.el.querySelector('.lab-thought-text').textContent}; }""")
    row, client, live = run["row"], run["client"], run["live"]
    # the thought is folded away, tags hidden; the answer is the rest
    assert run["thought"].strip() == "The user wants a short reply; keep it brief."
    assert "<think>" not in run["answer"] and "</think>" not in run["answer"] and run["answer"].strip()
    assert page.locator(LAST + " details.lab-thought").get_attribute("open") is None  # folded
    summary = page.inner_text(LAST + " details.lab-thought summary")
    assert summary.startswith("thought for ") and f"{row['thought_tokens']} tokens" in summary
    # the server's figures: a thought, then an answer after it
    assert row["ttft_thought_ms"] is not None and row["thinking_ms"] > 0
    assert row["ttfa_ms"] > row["ttft_thought_ms"] + row["thinking_ms"] - 1e-6
    # the browser's: painted after the server sampled them, and the page's live figures are the server's join
    for key in ("client_ttft_thought_ms", "client_thinking_ms", "client_ttfa_ms"):
        assert row[key] is not None and client[key] == pytest.approx(live[key])
    assert row["client_ttfa_ms"] > row["client_ttft_thought_ms"] and row["client_ttfa_ms"] > row["client_ttft_ms"]
    # the overlays: a thought band in both rows of TTFT vs total, an answer mark, a thinking stage
    ov = "#lab-ov-chat"
    assert page.locator(ov + " .lab-card:first-child .lab-thought-band").count() == 2
    assert page.locator(ov + " .lab-answer-mark").count() == 2
    assert "answer " in page.inner_text(ov + " .lab-card:first-child")
    assert "thinking" in page.inner_text(ov + " .lab-card:nth-child(2)")
    stats = page.inner_text(LAST + " .lab-stats")
    assert "answer TTFT" in stats and "thought " in stats
    page.screenshot(path=str(artifacts / "page-thinking.png"), full_page=True)
