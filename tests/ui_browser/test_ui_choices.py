"""Every choice the page offers works from the page: each Weights variant and each Speculation mode
in the Dropdowns as a user opens them, and every A/B preset button. Each gives a reply, its
overlay and (A/B) the delta table; none ends in an error."""

import time

from .test_ui_page import last_run, open_page, set_number


def offered(page, elem_id):
    """The labels of the options a Gradio dropdown shows when it is opened."""
    page.click(f"#{elem_id} input")
    items = page.locator(f"#{elem_id} [role=option]")
    items.first.wait_for()
    found = [items.nth(i).get_attribute("aria-label") for i in range(items.count())]
    page.keyboard.press("Escape")
    return found


def choose(page, elem_id, label):
    """Pick `label` as a user would: type to filter, Enter. Under load Enter can take another
    highlighted match (int4wo also matches int4wo+head) while the box still shows the typed text;
    after a blur the box shows what is really selected, so that is what is checked (and retried)."""
    box = page.locator(f"#{elem_id} input")
    for _ in range(3):
        box.click()
        box.fill(label)  # the dropdown filters its options by what is typed; Enter takes the match
        page.locator(f"#{elem_id} [role=option][aria-label={label!r}]").wait_for()
        box.press("Enter")
        box.blur()
        page.wait_for_timeout(300)  # the blur's reset of the box to the selected value
        if box.input_value() == label:
            return
    raise AssertionError(f"{elem_id}: could not select {label!r} (the box shows {box.input_value()!r})")


def send_and_check(page, what):
    n = page.evaluate("() => window.lab.panes.chat ? window.lab.panes.chat.runs.length : 0")
    page.fill("#lab-msg textarea", "Say hi.")
    page.click("#lab-send")
    page.wait_for_function(f"() => window.lab.panes.chat.runs.length === {n + 1} && "
                           f"(window.lab.panes.chat.runs[{n}].row || window.lab.panes.chat.runs[{n}].error)",
                           timeout=600_000)
    run = last_run(page, "chat")
    assert run["error"] is None, (what, run["error"])
    assert run["row"]["output_tokens"] >= 1 and run["reply"], what
    assert page.locator("#lab-ov-chat .lab-card").count() == 4, what
    return run


def test_every_weights_and_speculation_choice_the_page_offers_gives_a_reply(page_server, browser_page,
                                                                           bundled_engine):
    page = browser_page
    open_page(page, page_server)
    set_number(page, "lab-chat-max", 3)
    weights = offered(page, "lab-chat-quantization")
    info = bundled_engine.info()
    assert weights[0] == f"{info.default_variant.name} (as loaded)"
    assert {label.split(" ")[0] for label in weights} == {v.name for v in info.variants if v.available}
    for label in weights:
        choose(page, "lab-chat-quantization", label)
        t0 = time.time()
        run = send_and_check(page, label)
        print(f"{label}: {time.time() - t0:.1f} s, {run['row']['decode_tps']} tok/s")
        assert run["row"]["quantization"] in (None, label.split(" ")[0]), run["row"]
    choose(page, "lab-chat-quantization", weights[0])
    modes = offered(page, "lab-chat-speculative")
    assert modes[0] == "off" and "prompt_lookup" in modes
    for mode in modes:
        choose(page, "lab-chat-speculative", mode)
        send_and_check(page, mode)


def test_every_preset_runs_both_panes_and_fills_the_delta_table(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    page.click("button[role=tab]:has-text('A/B')")
    presets = page.evaluate("() => window.LAB_CONFIG.presets")
    assert presets and all(p["available"] for p in presets.values()), presets
    for name in presets:
        page.evaluate("() => { const d = document.querySelector('#lab-delta'); d.dataset.seen = d.innerHTML; }")
        page.click(f"#lab-preset-{name}")
        page.wait_for_function("() => { const d = document.querySelector('#lab-delta'); "
                               "return d.querySelector('table') && d.innerHTML !== d.dataset.seen; }",
                               timeout=300_000)
        for side in ("A", "B"):
            run = last_run(page, side)
            assert run["error"] is None, (name, side, run["error"])
            assert run["reply"] and page.locator(f"#lab-ov-{side} .lab-card").count() == 4, (name, side)
        assert "winner" in page.inner_text("#lab-delta"), name
