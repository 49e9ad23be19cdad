"""Speculation replayed on the page: a copy-heavy prompt with prompt lookup shows, under the reply,
its accepted and rejected drafts, a step-by-step replay control, acceptance by draft position and
the predicted speedup beside the measured one."""

import re

from ui.shell.presets import load_prompt_sets

from .test_ui_choices import choose
from .test_ui_page import last_run, open_page, set_number


def test_a_copy_heavy_reply_shows_rejected_drafts_and_both_speedups(page_server, browser_page, artifacts):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 48)
    set_number(page, "lab-chat-temperature", 0)
    choose(page, "lab-chat-speculative", "prompt_lookup")
    page.locator("#lab-chat-speculative-adaptive input[type=checkbox]").uncheck()  # verify every lookup
    set_number(page, "lab-chat-num-speculative-tokens", 8)
    page.fill("#lab-msg textarea", load_prompt_sets()["copy_edits"]["items"][0]["turns"][0])
    page.click("#lab-send")
    block = page.locator("#lab-log-chat .lab-msg.assistant:last-child .lab-replay")
    block.wait_for(timeout=300_000)
    block.scroll_into_view_if_needed()
    block.screenshot(path=str(artifacts / "speculation_replay.png"))
    run = last_run(page, "chat")
    assert run["error"] is None and run["row"]["drafted"] > run["row"]["accepted"] > 0, run["row"]
    rejected = block.locator("s.lab-tok-rej[data-step]")
    assert rejected.count() == run["row"]["drafted"] - run["row"]["accepted"]
    assert "rejected" in rejected.first.get_attribute("title")
    assert block.locator(".lab-tok-acc[data-step]").count() == run["row"]["accepted"]
    figs = block.locator(".lab-replay-figs").inner_text()
    predicted = re.search(r"predicted speedup (\d+\.\d\d)x", figs)
    measured = re.search(r"measured (\d+\.\d\d)x", figs)
    assert predicted and measured and "acceptance by draft position: 1: " in figs, figs
    # the replay control: step 1 shows only the first two steps' tokens
    slider = block.locator("input.lab-replay-step")
    slider.fill("1")
    later = block.locator("[data-step].lab-later").count()
    assert later > 0 and block.locator("[data-step]:not(.lab-later)").count() + later == block.locator(
        "[data-step]").count()
    assert block.locator(".lab-now").count() >= 1
