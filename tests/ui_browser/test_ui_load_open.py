"""The Load tab's open-loop mode in a real browser, through its controls: a SHORT sweep (3 requests a
level, 4 tokens, 2 levels, max batch 1 and 4) on the tiny model, as app.py serves it (a batching
engine with the API mounted). The plots get a curve per max batch, the knee is ringed, the Pareto
plot has a line per max batch, the probe has a stage bar at every level, and the judge finds nothing
lost, crossed, mismatched or stuck."""

import pytest

from engine.serving.service import Engine
from server.api import create_api
from server.run import BackgroundServer
from ui.webapp import create_app

from .test_ui_page import open_page, set_number


@pytest.fixture(scope="module")
def sweep_server(tiny):
    engine = Engine(tiny, max_batch=4)
    api = create_api(engine)
    with BackgroundServer(create_app(api.state.backends, app=api)) as url:
        yield url
    engine.close()


def set_value(page, elem_id, value):
    """A slider's number box (set_number) or a plain number field."""
    if page.locator(f"#{elem_id} input[type=range]").count():
        set_number(page, elem_id, value)
        return
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Tab")


def test_a_short_sweep_through_the_tab_draws_the_plots_the_knee_and_the_probe(sweep_server, browser_page, artifacts):
    page = browser_page
    open_page(page, sweep_server)
    page.get_by_role("tab", name="Load").click()
    page.get_by_label("Open loop: requests arrive at a rate, swept up to saturation").check()
    page.wait_for_selector("#lab-openloop-run", state="visible")
    for elem, value in (("lab-openloop-num-prompts", 3), ("lab-openloop-max-new-tokens", 4),
                        ("lab-openloop-start-rate", 4), ("lab-openloop-factor", 2), ("lab-openloop-max-levels", 2),
                        ("lab-openloop-ttft-ms", 60000), ("lab-openloop-tpot-ms", 60000)):
        set_value(page, elem, value)
    assert page.locator("#lab-openloop-max-batches input[type=checkbox]:checked").count() == 2  # 1 and 4 ticked
    page.fill("#lab-openloop-probe textarea", "Tell me about the moon.")
    page.click("#lab-openloop-run")
    page.wait_for_function("() => window.lab.openLoop.snapshot && window.lab.openLoop.snapshot.status === 'done'",
                           timeout=300_000)
    snap = page.evaluate("() => window.lab.openLoop.snapshot")
    assert snap["spec"]["probe"] == "Tell me about the moon." and snap["spec"]["max_new_tokens"] == 4
    assert [s["max_batch"] for s in snap["sweeps"]] == [1, 4]
    assert page.evaluate("() => window.lab.openLoop.polls") >= 2  # drawn while it ran
    plots = page.locator("#lab-openloop-plots")
    for i, s in enumerate(snap["sweeps"]):
        assert [r["request_rate"] for r in s["levels"]] == [4.0, 8.0]
        assert all(r["completed"] == r["exact"] == 3 for r in s["levels"])
        assert s["totals"]["lost"] == s["totals"]["crossed"] == s["totals"]["mismatched"] == s["totals"]["stuck"] == 0
        for key in ("request_goodput", "output_throughput", "p90_ttft_ms", "p90_tpot_ms"):
            line = plots.locator(f"path.lab-ol-line[data-key='{key}'][data-sweep='{i}']")
            assert line.count() == 1 and line.get_attribute("data-points") == "2", key
        assert plots.locator(f"circle.lab-ol-knee[data-sweep='{i}']").count() == 1  # the knee, ringed
        assert s["knee_request_rate"] in (4.0, 8.0)
        assert int(plots.locator(f"path.lab-ol-pareto-line[data-sweep='{i}']").get_attribute("data-points")) == 2
        bars = plots.locator(f"g.lab-ol-probe-bar[data-sweep='{i}']")
        assert bars.count() == 2  # the probe at every level
        for j in range(2):
            stages = bars.nth(j).locator("rect").evaluate_all("rs => rs.map(r => r.dataset.stage)")
            assert "prefill" in stages and "decode" in stages, stages
            assert bars.nth(j).get_attribute("data-outcome") == "exact"
        legend = plots.locator(f".lab-ol-sweep[data-sweep='{i}']").inner_text()
        assert "lost 0" in legend and "crossed 0" in legend and "knee" in legend
    assert plots.locator("line.lab-ol-objective").count() == 2  # TTFT and TPOT objectives, dashed
    assert page.locator("#lab-openloop-table tbody tr").count() == 4
    assert page.locator("#lab-openloop-table tr.lab-ol-knee-row").count() == 2
    assert page.inner_text("#lab-openloop-sentence").startswith("Max batch 4 reached")
    page.screenshot(path=str(artifacts / "page-load-open.png"), full_page=True)

    # out of range: a message on the tab, no sweep
    page.evaluate("() => { window.lab.openLoop.snapshot = null; }")
    values = page.evaluate("() => window.LAB_CONFIG.openLoopFields.map((f) => f === 'max_batches' ? [9] : null)")
    page.evaluate("(v) => window.lab.openLoop.start(v)", values)
    page.wait_for_function(
        "() => document.querySelector('#lab-openloop-status').textContent.includes('max batch must be 1 to 4')")
