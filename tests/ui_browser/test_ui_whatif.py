"""What-if from the page: under a chat reply, predict the TTFT of a prompt 4x as long, run it, and
see the prediction beside the measured value and the error (the figures are printed, not asserted:
a wall-clock time on a shared machine is not a test's business)."""

import re

from .test_ui_page import open_page, set_number

BASE = "#lab-log-chat .lab-msg.assistant"


def test_a_4x_longer_prompt_is_predicted_then_run_and_checked(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 8)
    set_number(page, "lab-chat-temperature", 0)
    page.fill("#lab-msg textarea", "Explain in detail how a hash table handles collisions, and compare chaining "
                                   "with open addressing.")
    page.click("#lab-send")
    bar = page.locator(f"{BASE} .lab-whatif").first
    bar.wait_for(timeout=120_000)
    bar.locator(".lab-whatif-factor").fill("4")
    bar.locator(".lab-whatif-predict").click()
    predicted = bar.locator(".lab-whatif-ttft")
    predicted.wait_for(timeout=30_000)
    assert "prompt × 4" in bar.locator(".lab-whatif-out").inner_text()
    bar.locator(".lab-whatif-run").click()
    check = bar.locator(".lab-whatif-check")
    check.wait_for(timeout=300_000)
    text = check.inner_text()
    print(text)
    found = re.search(r"at the ([\d,]+) prefill tokens that ran: TTFT predicted ([\d,.]+) ms, measured ([\d,.]+) ms, "
                      r"error ([+-]\d+)%", text)
    assert found, text
    n, pred, meas, err = (float(g.replace(",", "")) for g in found.groups())
    assert pred > 0 and meas > 0 and err == round(100 * (pred / meas - 1)) or abs(err - 100 * (pred / meas - 1)) <= 1
    runs = page.evaluate("() => window.lab.panes.chat.runs.map(r => r.row && r.row.prefill_tokens)")
    assert len(runs) == 2 and runs[1] == n and runs[1] > 3 * runs[0] * 0.8, runs  # the prompt that ran is longer
