"""Every choice the page offers works from the page: each Weights variant and each Speculation mode
in the Dropdowns as a user opens them, and every A/B preset button. Each gives a reply, its
overlay and (A/B) the delta table; none ends in an error."""

import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from engine.kernels import cpu_gemm, cpu_qdot
from engine.platform import capabilities
from ui.compare.tab import preset_missing
from ui.shell.presets import QUANT_VARIANT, load_prompt_sets, teaching_presets

from .test_ui_page import last_run, open_ab, open_page, run_ab, set_number


def offered(page, elem_id):
    """The labels of the options a Gradio dropdown shows when it is opened."""
    page.click(f"#{elem_id} input")
    items = page.locator(f"#{elem_id} [role=option]")
    items.first.wait_for()
    found = [items.nth(i).get_attribute("aria-label") for i in range(items.count())]
    page.keyboard.press("Escape")
    return found


def choose(page, elem_id, label):
    """Pick `label` as a user would: type to filter, then Enter (the first try) or a click on the
    option (the retries). Under load Enter can take another highlighted match (int4wo also matches
    int4wo+head), or none yet, while the box still shows the typed text; after a blur the box shows
    what is really selected, so that is what is checked (and retried)."""
    box = page.locator(f"#{elem_id} input")
    for attempt in range(3):
        box.click()
        box.fill(label)  # the dropdown filters its options by what is typed
        option = page.locator(f"#{elem_id} [role=option][aria-label={label!r}]")
        try:
            option.wait_for(timeout=15_000)
        except PlaywrightTimeout:  # the list did not open this time (seen once in a full run): open it again
            box.press("Escape")
            box.blur()
            continue
        if attempt == 0:
            box.press("Enter")  # Enter takes the match
        else:
            option.click()
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


def test_every_preset_runs_both_panes_and_fills_the_delta_table(page_server, browser_page, bundled_engine):
    page = browser_page
    open_page(page, page_server)
    page.click("button[role=tab]:has-text('A/B')")
    presets = page.evaluate("() => window.LAB_CONFIG.presets")
    missing = {name: preset_missing(p, bundled_engine.info()) for name, p in teaching_presets(load_prompt_sets()).items()}
    assert {name: p["available"] for name, p in presets.items()} == {n: why is None for n, why in missing.items()}
    if not capabilities.detect().cpp_compiler:  # the presets a machine may lack (each says why)
        assert "C++ compiler" in missing["compiled_step"]
    if cpu_qdot.best_form(capabilities.detect()) is None:
        assert "our kernels" in missing["quantization"]
    if cpu_gemm.unavailable_reason() is not None:
        assert "our kernels" in missing["bf16_weights"]
    assert all(p["available"] for n, p in presets.items() if n not in ("compiled_step", "quantization", "bf16_weights")), missing
    for name in (n for n, p in presets.items() if p["available"]):
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


@pytest.mark.skipif(not capabilities.detect().cpp_compiler,
                    reason="no C++ compiler: the page shows Compiled step disabled (test_contracts checks the reason)")
def test_the_compiled_step_checkbox_runs_pane_b_through_the_graph(page_server, browser_page):
    """Tick Compiled step in pane B only: both panes answer, B's steps went through the graph
    (its record says so, its config label too), and in fp32 the two greedy replies are the same."""
    page = browser_page
    open_ab(page, page_server, 12)
    page.check("#lab-B-compiled-decode input[type=checkbox]")
    run_ab(page, "Name a color.", timeout=600_000)  # the first compiled request compiles
    steps = page.evaluate("() => ['A', 'B'].map(s => { const r = window.lab.panes[s].runs.at(-1); "
                          "return [r.error, r.record && r.record.timeline.decode_step || null, r.row.config]; })")
    assert steps[0][:2] == [None, None] and steps[1][:2] == [None, "compiled"], steps
    assert "compiled step" not in steps[0][2] and "compiled step" in steps[1][2]
    rows = [last_run(page, s)["row"] for s in "AB"]
    sent = [last_run(page, s)["sent"] for s in "AB"]
    assert [s["max_new_tokens"] for s in sent] == [12, 12], sent  # each pane sent what its slider shows
    assert last_run(page, "A")["reply"] == last_run(page, "B")["reply"], [
        {k: r.get(k) for k in ("output_tokens", "finish_reason", "cached_tokens", "config", "dtype")} for r in rows]
    assert "The two replies are identical." in page.inner_text("#lab-delta")


def test_the_quantization_preset_runs_pane_b_on_the_integer_kernel_variant(page_server, browser_page, bundled_engine):
    """Click the quantization preset as a user would: the note says what to see, B's Weights control shows
    QUANT_VARIANT, and B's reply was served by it (the engine's own word in its timeline, and the reply's
    config label) while A's ran the weights as loaded. Where our integer kernels cannot run, the button
    says why and neither pane runs."""
    page = browser_page
    open_page(page, page_server)
    page.click("button[role=tab]:has-text('A/B')")
    info = bundled_engine.info()
    missing = preset_missing(teaching_presets(load_prompt_sets())["quantization"], info)
    page.click("#lab-preset-quantization")
    if missing:
        page.wait_for_function("() => document.body.innerText.includes('integer kernels')", timeout=60_000)
        assert page.evaluate("() => ['A', 'B'].map(s => window.lab.panes[s].runs.length)") == [0, 0]
        return
    page.wait_for_selector("#lab-delta table", timeout=600_000)  # B's first turn builds the variant
    note = page.locator("text=measured, not assumed").first
    assert note.is_visible() and QUANT_VARIANT in note.inner_text()
    page.click("text=B settings")  # the pane's controls, as the preset set them
    assert page.locator("#lab-B-quantization input").input_value() == QUANT_VARIANT
    served = page.evaluate("() => ['A', 'B'].map(s => { const r = window.lab.panes[s].runs.at(-1); "
                           "return [r.error, r.record.timeline.quantization, r.row.config, r.row.output_tokens]; })")
    (a_err, a_weights, a_label, a_tokens), (b_err, b_weights, b_label, b_tokens) = served
    assert a_err is None and b_err is None, served
    assert a_weights == info.default_variant.name and b_weights == QUANT_VARIANT, served
    assert QUANT_VARIANT in b_label and QUANT_VARIANT not in a_label, served
    assert a_tokens >= 1 and b_tokens >= 1, served
    assert "winner" in page.inner_text("#lab-delta")
