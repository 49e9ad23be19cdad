"""The Sweep decides: 8 items through the A/B tab's two configs, from the page's controls, give a
95% interval per metric, a decision per metric, the replies check and a verdict sentence."""

import re

from .test_ui_page import open_ab, run_ab, set_number


def test_a_sweep_of_8_items_shows_intervals_and_a_verdict(page_server, browser_page, artifacts):
    page = browser_page
    open_ab(page, page_server, 6)
    page.locator("#lab-B-kv-reuse input[type=checkbox]").uncheck()  # B: KV reuse off, a lossless toggle
    page.click("button[role=tab]:has-text('Sweep')")
    page.click("label:has-text('Open-ended questions')")  # 8 items
    set_number(page, "lab-sweep-items", 8)
    page.click("#lab-sweep-run")
    verdict = page.locator("#lab-sweep-summary .lab-verdict")
    verdict.wait_for(timeout=600_000)
    text = verdict.inner_text()
    page.screenshot(path=str(artifacts / "sweep_stats.png"), full_page=True)
    assert text.startswith("Verdict. B "), text
    assert ", 8 items" in text, text  # the first clause names the items the interval is over
    # KV reuse is declared lossless and the page server runs fp32 greedy: every reply identical
    assert text.endswith("8 of 8 replies identical."), text
    cells = page.locator("#lab-sweep-summary table.lab-paired td.lab-ci").all_inner_texts()
    assert len(cells) >= 3 and all(re.fullmatch(r"\d+\.\d\d–\d+\.\d\d", c) for c in cells), cells
    lows_highs = [tuple(map(float, c.split("–"))) for c in cells]
    assert all(lo <= hi for lo, hi in lows_highs)
    decisions = page.locator("#lab-sweep-summary table.lab-paired tbody tr td:nth-child(4)").all_inner_texts()
    for (lo, hi), d in zip(lows_highs, decisions):  # a side is named only where the interval excludes 1
        assert (d in ("A", "B")) == (lo > 1 or hi < 1) or "no better side" in d, (lo, hi, d)
        if lo <= 1 <= hi:
            assert d == "no difference detected (n = 8)"
    assert "Replies: 8 of 8 replies identical" in page.inner_text("#lab-sweep-summary .lab-replies-line")


def test_the_same_prompt_run_again_in_ab_gets_an_interval_over_the_runs(page_server, browser_page):
    page = browser_page
    open_ab(page, page_server, 4)
    run_ab(page, "Name a fruit.")
    assert "run the same prompt again" in page.inner_text("#lab-delta")
    for runs in (2, 3):
        page.fill("#lab-ab-msg textarea", "Name a fruit.")
        page.click("#lab-ab-run")
        page.wait_for_selector(f"#lab-delta h4:has-text('Over {runs} runs of this prompt')", timeout=120_000)
    text = page.inner_text("#lab-delta .lab-repeat-verdict")
    assert text.startswith("Verdict. B ") and ", 3 items" in text and text.endswith("3 of 3 replies identical."), text
    cells = page.locator("#lab-delta table.lab-paired td.lab-ci").all_inner_texts()
    assert cells and all(re.fullmatch(r"\d+\.\d\d–\d+\.\d\d", c) for c in cells), cells
    # the latest pair's TTFT change, split into measured terms that add up to it
    rows = page.locator("#lab-delta table.lab-attribution tr").all_inner_texts()
    figures = {r.split("\t")[0]: r.split("\t")[-1] for r in rows}
    total = next(v for k, v in figures.items() if k.startswith("sum of the terms"))
    measured = next(v for k, v in figures.items() if k.startswith("measured change in TTFT (browser)"))
    assert "prefill tokens avoided" in " ".join(figures) and "network" in " ".join(figures), figures

    def ms(text):
        return float(text.replace(" ms", "").replace(",", ""))

    assert abs(ms(total) - ms(measured)) <= 0.2, figures
