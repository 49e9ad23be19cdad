"""The Load tab in a real browser on the bundled model, as app.py serves it (a batching engine with
the API mounted): a small load of two runs (max batch 1, then 2) through the API on loopback;
the live plots get points, the delta table holds both runs' figures, and the judge finds nothing
lost, crossed or mismatched. Bad input gets a message, not a traceback."""

import json

import pytest

from engine.serving.service import Engine
from server.api import create_api
from server.run import BackgroundServer
from ui.webapp import create_app

from .test_ui_page import open_page, set_number


@pytest.fixture(scope="module")
def load_server(bundled):
    engine = Engine(bundled, max_batch=2)
    api = create_api(engine)
    with BackgroundServer(create_app(api.state.backends, app=api)) as url:
        yield url
    engine.close()


def open_load_tab(page, url):
    open_page(page, url)
    page.get_by_role("tab", name="Load").click()
    page.wait_for_selector("#lab-load-run")


def test_two_small_runs_plot_live_and_fill_the_delta_table(load_server, browser_page, artifacts):
    page = browser_page
    open_load_tab(page, load_server)
    for elem, value in (("lab-load-clients", 2), ("lab-load-requests-per-client", 2), ("lab-load-max-batch-1", 1),
                        ("lab-load-max-batch-2", 2)):
        set_number(page, elem, value)
    page.fill("#lab-load-max-new-tokens input", "4")
    page.press("#lab-load-max-new-tokens input", "Tab")
    page.click("#lab-load-run")
    page.wait_for_function("() => window.lab.load.snapshot && window.lab.load.snapshot.status === 'done'",
                           timeout=240_000)
    snap = page.evaluate("() => window.lab.load.snapshot")
    assert snap["spec"]["max_new_tokens"] == 4 and [r["max_batch"] for r in snap["runs"]] == [1, 2]
    assert page.evaluate("() => window.lab.load.polls") >= 2  # drawn while it ran, not only at the end
    for i, run in enumerate(snap["runs"]):
        f = run["figures"]
        assert f["requests"] == 4 and f["exact"] == 4  # every reply equals the same request alone
        assert f["lost"] == f["crossed"] == f["mismatched"] == f["stuck"] == f["errors"] == 0
        assert f["output_tok_per_s"] > 0 and f["ttft_ms_p50"] is not None
        line = page.locator(f"#lab-load-plots path.lab-load-line[data-run='{i}']")
        assert line.count() == 2  # output tok/s and requests/s over time
        assert int(line.first.get_attribute("data-points")) >= 1
        assert page.locator(f"#lab-load-plots svg.lab-load-ttft_ms circle.lab-load-dot[data-run='{i}']").count() == 4
        assert page.locator(f"#lab-load-plots svg.lab-load-queue_ms circle.lab-load-dot[data-run='{i}']").count() == 4
        legend = page.inner_text(f"#lab-load-plots .lab-load-run[data-run='{i}']")
        assert "lost 0" in legend and "crossed 0" in legend and "mismatched 0" in legend
    head = page.inner_text("#lab-load-delta thead")
    assert "run 1: max batch 1" in head and "run 2: max batch 2" in head
    for metric in ("output_tok_per_s", "ttft_ms_p50", "tpot_ms_p50", "queue_ms_p50"):
        cells = page.locator(f"#lab-load-delta tr[data-metric='{metric}'] td").all_inner_texts()
        assert len(cells) == 3 and all(c.strip() not in ("", "—") for c in cells[:2]), (metric, cells)
    assert page.inner_text("#lab-load-delta tr[data-metric='lost']").split()[-3:-1] == ["0", "0"]
    # one at a time, no decode token shares its forward with another's prompt: a measured 0, not unknown
    assert page.locator("#lab-load-delta tr[data-metric='with_prompt_share'] td").all_inner_texts()[0] == "0%"
    assert snap["runs"][1]["figures"]["itl_ms_decode_only_p50"] is not None
    sentence = page.inner_text("#lab-load-sentence")
    assert sentence.startswith("Max batch 2 gave") and "at 2 clients" in sentence and "p50 TTFT went from" in sentence
    page.screenshot(path=str(artifacts / "page-load.png"), full_page=True)

    # the run's trace: every request of both runs on one timeline, a server track each
    link = page.locator("#lab-load-trace a")
    assert link.inner_text() == "Trace (8 requests)"
    with page.expect_download() as download:
        link.click()
    path = artifacts / "trace-load.json"
    download.value.save_as(path)
    trace = json.loads(path.read_text())
    ids = [p["request_id"] for run in snap["runs"] for p in run["points"]]
    assert [r["request_id"] for r in trace["otherData"]["replies"]] == ids
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {f"max batch {b} · {i} · server" for b, i in zip([1] * 4 + [2] * 4, ids)} <= tracks, tracks

    # out of range: a message on the tab, no run
    set_number(page, "lab-load-clients", 32)
    page.evaluate("() => window.lab.load.start([2, 2, 4, 1, 9, 2, 0, 'exponential', 0, 0, 'load_pool', ''])")  # max batch 9 > the engine's 2 (LOAD_FIELDS' order)
    page.wait_for_function("() => document.querySelector('#lab-load-status').textContent.includes('max batch must be')")


def test_multi_turn_chats_with_think_time_show_reuse_collapse_under_a_small_kv_budget(load_server, browser_page,
                                                                                       artifacts):
    """Three-turn conversations with a pause between turns, run 1 under a KV budget too small to keep any
    history, run 2 under the engine's own: run 2's follow-ups reuse their history, run 1's do not, and
    the sentence names the budget at which reuse collapses."""
    page = browser_page
    open_load_tab(page, load_server)
    for elem, value in (("lab-load-clients", 2), ("lab-load-requests-per-client", 3), ("lab-load-max-batch-1", 2),
                        ("lab-load-max-batch-2", 2), ("lab-load-turns", 3), ("lab-load-think-time-s", 0.5)):
        set_number(page, elem, value)
    for elem, value in (("lab-load-max-new-tokens", "4"), ("lab-load-kv-budget-mb-1", "0.01")):
        page.fill(f"#{elem} input", value)
        page.press(f"#{elem} input", "Tab")
    page.click("#lab-load-run")
    page.wait_for_function("() => window.lab.load.snapshot && window.lab.load.snapshot.status === 'done'",
                           timeout=300_000)
    snap = page.evaluate("() => window.lab.load.snapshot")
    small, own = (run["reuse"] for run in snap["runs"])
    assert small["kv_budget_mb"] == 0.01 and own["kv_budget_mb"] > small["kv_budget_mb"]
    assert small["follow_ups"] >= 2 and own["follow_ups"] >= 2  # follow-up turns ran in both (clients share the pool)
    assert own["follow_up_reuse_rate"] > small["follow_up_reuse_rate"]
    assert own["prefix_hit_rate"] > small["prefix_hit_rate"]
    assert small["kv_rejected"] > 0  # the small budget could keep no history
    rows = page.locator("#lab-load-reuse table.lab-reuse-table tbody tr")
    assert rows.count() == 2
    sentence = page.inner_text("#lab-load-reuse .lab-reuse-sentence")
    assert "0.01 MiB KV budget reuse collapses at 2 clients" in sentence, sentence
    page.screenshot(path=str(artifacts / "page-load-reuse.png"), full_page=True)
