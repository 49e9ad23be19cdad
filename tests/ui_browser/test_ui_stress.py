"""This browser's paint limit, on the page: the Chat tab's stress run streams the long markdown reply
(ui/chat/stress.py) from the paced source through the page's own path and shows, per rate, paint lag
p50/p99, long tasks, render cost per update split markdown vs DOM, dropped frames, and one sentence
naming where it falls behind. Render cost per update must not grow with the reply's length: asserted
as the shape of the curve (late vs early updates), never as a time."""

import pytest
from support import paced_app

from ui.chat.stress import REPLY_TOKENS


@pytest.fixture(scope="module")
def stress_app():
    with paced_app(200) as url:  # the app's own backend; the stress run brings its own paced source
        yield url


def test_the_stress_run_measures_each_rate_and_render_cost_stays_flat(stress_app, browser_page, artifacts):
    page = browser_page
    page.goto(stress_app)
    page.wait_for_selector("#lab-stress-run")
    page.wait_for_function("() => window.lab && window.lab.session && window.lab.clock.offset !== null")
    # one fast rate streams the whole reply (the button runs the declared rates; the test picks one, to keep it short)
    result = page.evaluate("() => window.lab.stress([1600])")
    assert result["error"] is None, result["error"]
    row = result["rows"][0]
    assert row["rate"] == 1600 and row["tokens"] == REPLY_TOKENS
    assert row["lag_p50_ms"] is not None and row["lag_p99_ms"] >= row["lag_p50_ms"]
    assert row["markdown_ms"] > 0 and row["dom_ms"] > 0 and row["frames"] > 10
    assert row["dropped_frames"] >= 0 and row["long_tasks"] >= 0
    # the shape: an update late in a 4,000-token reply costs about what an early one does (re-rendering
    # the whole reply per update would make the last quarter ~7x the first)
    assert row["cost_growth"] is not None and row["cost_growth"] < 2.5, row
    md = "#lab-log-chat .lab-msg.assistant:last-child .lab-md"
    assert page.locator(md + " table.lab-md-table").count() > 5 and page.locator(md + " pre code").count() > 5
    table = page.locator("#lab-stress .lab-stress-table tbody tr")
    assert table.count() == 1 and table.first.get_attribute("data-rate") == "1600"
    verdict = page.inner_text("#lab-stress .lab-stress-verdict")
    assert ("keeps up to 1,600 tok/s" in verdict) != ("at 1,600 tok/s it falls behind" in verdict)
    assert "time went to" in verdict
    page.screenshot(path=str(artifacts / "page-stress.png"), full_page=True)
